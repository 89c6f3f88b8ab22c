"""The driver of `aiv audit`'s Mooncake paths, mooncake-ascend and mooncake-ascend+aiv (host/audit/mooncake/driver.rs
embeds it and runs it with `python -c`).

One process per side, started once per audit with the Python of the virtualenv that holds Mooncake's Ascend wheel
(mooncake-transfer-engine-npu) and the path's libascendcl.so (the twin runtime), libllm_datadist.so (the twin's HiXL
model, or this project's engine over aiv) and libmetadef.so first on LD_LIBRARY_PATH:

    python -c SCRIPT target|initiator

It reads one JSON object per line on stdin and answers each with one JSON object per line on stdout ({"ok": true,
...} or {"ok": false, "error": "..."}); its log goes to stderr. End of input ends it. Commands:

    init {size, fill, evidence}
                               the twin runtime's provenance records on (cannTwinRecordProvenance), aclInit,
                               aclrtSetDevice(0) (as torch_npu would), aclrtMalloc(size) filled with the byte `fill`
                               through aclrtMemcpy, TransferEngine.initialize("127.0.0.1", "P2PHANDSHAKE", "ascend",
                               ""), register_memory (timed); answers name, addr, register_s, runtime, wheel, python.
                               `evidence` is the layout of cannTwinEvidence to read ({version, size, counts: [name,
                               ...]}, the twin library's own cannTwinEvidenceLayout text, from
                               cann_twin::evidence::layout_json: the driver keeps no list of its own)
    snapshot                   process CPU (Host threads) and the twin's evidence counts now
    connect {peer, remote}     (initiator) one 64-byte read, so that the wheel's auto-connect happens before the
                               first cell, as the engine paths open their segment before theirs
    run {peer, remote, lists, seconds}
                               (initiator) lists[t] are thread t's batches, each [[op, local offset, remote offset,
                               length], ...] with op "read" or "write"; each thread submits its batches in turn with
                               batch_transfer_sync_read/write until `seconds` have passed; answers the cell's figures
    layerwise {peer, remote, requests, compute_us, seconds}
                               (initiator) requests[i] is a list of layers, each a batch of WRITEs; per layer
                               compute_us of sleep, then batch_transfer_async_write without waiting; the request
                               ends when get_batch_transfer_status (which waits) says every layer's batch has
    batch {peer, remote, op, locals, remotes, lengths}
                               (initiator) one batch_transfer_sync_read/write (the error-recovery rounds); answers
                               its return code and how long it took (ms)
    fill {seed}                the whole buffer := pattern(seed), through aclrtMemcpy
    digest                     sha256 of the whole buffer, read back through aclrtMemcpy
    copy_all {peer, remote, op}
                               (initiator) moves the whole buffer to (write) or from (read) the peer's, 1 MiB a
                               request, 16 requests a batch
    quit                       unregister_memory, then exit

Process CPU is getrusage(RUSAGE_SELF) (every thread the process ran, the exited ones included) less the run time of
the twin runtime's own threads alive now (named cann-twin-*: its device model, /proc/self/task/*/schedstat), which
is reported apart as device-model CPU.
"""

import ctypes
import hashlib
import json
import os
import random
import resource
import sys
import threading
import time

ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
CHUNK = 4 << 20
MAX_LATENCIES = 200_000



def evidence_structure(spec):
    """The ctypes structure of cannTwinEvidence's layout `spec` names (host/audit/mooncake/session.rs sends it with init:
    cann_twin::evidence::layout_json, the text the twin library exports as cannTwinEvidenceLayout): the header (uint32
    version, uint32 size, char runtime[32]), then one uint64 per count name in order. None when that layout does not
    have the size the Rust side gives."""

    class Evidence(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("size", ctypes.c_uint32), ("runtime", ctypes.c_char * 32)] + [
            (str(name), ctypes.c_uint64) for name in spec["counts"]
        ]

    if ctypes.sizeof(Evidence) != int(spec["size"]):
        log(f"the evidence layout has {ctypes.sizeof(Evidence)} bytes, not {spec['size']}: counts not read")
        return None
    return Evidence


def log(*parts):
    print("mooncake-ascend driver:", *parts, file=sys.stderr, flush=True)


class Failed(Exception):
    pass


def check(code, what):
    if code != 0:
        raise Failed(f"{what} returned {code}")


class Side:
    def __init__(self):
        self.acl = ctypes.CDLL("libascendcl.so")
        self.acl.aclrtMemcpy.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
        ]
        self.acl.aclrtMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int]
        try:
            self.evidence_fn = self.acl.cannTwinEvidence
            self.evidence_fn.argtypes = [ctypes.c_void_p]
        except AttributeError:
            self.evidence_fn = None  # not the twin runtime: the counts are not observable
        self.evidence_spec = None
        self.evidence_type = None
        self.te = None
        self.memory = None
        self.size = 0

    # Device memory, reached only through the runtime's copies.
    def to_device(self, offset, data):
        buffer = ctypes.create_string_buffer(bytes(data), len(data))
        code = self.acl.aclrtMemcpy(self.memory + offset, len(data), buffer, len(data), ACL_MEMCPY_HOST_TO_DEVICE)
        check(code, "aclrtMemcpy H2D")

    def from_device(self, offset, size):
        buffer = ctypes.create_string_buffer(size)
        code = self.acl.aclrtMemcpy(buffer, size, self.memory + offset, size, ACL_MEMCPY_DEVICE_TO_HOST)
        check(code, "aclrtMemcpy D2H")
        return buffer.raw

    def init(self, size, fill, spec):
        if self.evidence_fn is not None and spec is not None:
            self.evidence_spec, self.evidence_type = spec, evidence_structure(spec)
            # The runtime's records on before anything runs, so that its counts say who did each act (twin-only).
            try:
                self.acl.cannTwinRecordProvenance.argtypes = [ctypes.c_uint32]
                self.acl.cannTwinRecordProvenance(1)
            except AttributeError:
                log("the runtime has no cannTwinRecordProvenance: its engine acts are not recorded")
        check(self.acl.aclInit(None), "aclInit")
        check(self.acl.aclrtSetDevice(0), "aclrtSetDevice(0)")
        pointer = ctypes.c_void_p()
        check(self.acl.aclrtMalloc(ctypes.byref(pointer), size, 0), "aclrtMalloc")
        self.memory, self.size = pointer.value, size
        for offset in range(0, size, CHUNK):
            self.to_device(offset, bytes([fill]) * min(CHUNK, size - offset))
        from mooncake.engine import TransferEngine

        self.te = TransferEngine()
        check(self.te.initialize("127.0.0.1", "P2PHANDSHAKE", "ascend", ""), "TransferEngine.initialize")
        started = time.perf_counter()
        check(self.te.register_memory(self.memory, size), "register_memory")
        register_s = time.perf_counter() - started
        try:
            from importlib.metadata import version

            wheel = version("mooncake-transfer-engine-npu")
        except Exception:  # the version is informative only
            wheel = None
        return {
            "name": f"127.0.0.1:{self.te.get_rpc_port()}",
            "addr": self.memory,
            "register_s": register_s,
            "runtime": (self.evidence() or {}).get("runtime"),
            "wheel": wheel,
            "python": sys.version.split()[0],
        }

    def evidence(self):
        if self.evidence_fn is None or self.evidence_type is None:
            return None
        out = self.evidence_type(version=int(self.evidence_spec["version"]), size=ctypes.sizeof(self.evidence_type))
        if self.evidence_fn(ctypes.byref(out)) != 0:
            return None
        counts = {str(name): getattr(out, str(name)) for name in self.evidence_spec["counts"]}
        counts["runtime"] = out.runtime.decode(errors="replace")
        return counts

    def snapshot(self):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        total = int((usage.ru_utime + usage.ru_stime) * 1e9)
        model = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as comm:
                    name = comm.read().strip()
                if name.startswith("cann-twin-"):
                    with open(f"/proc/self/task/{tid}/schedstat") as stat:
                        model += int(stat.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # the thread ended meanwhile
        return {"host_cpu_ns": max(total - model, 0), "device_model_cpu_ns": model, "evidence": self.evidence()}

    def batch(self, peer, remote, op, locals_, remotes, lengths):
        local = [self.memory + o for o in locals_]
        far = [remote + o for o in remotes]
        if op == "write":
            return self.te.batch_transfer_sync_write(peer, local, far, lengths)
        return self.te.batch_transfer_sync_read(peer, local, far, lengths)

    def run(self, peer, remote, lists, seconds):
        prepared = []
        for batches in lists:
            mine = []
            for batch in batches:
                ops = {request[0] for request in batch}
                if len(ops) != 1 or not ops <= {"read", "write"}:
                    raise Failed("a batch must hold requests of one opcode, read or write")
                mine.append((ops.pop(), [r[1] for r in batch], [r[2] for r in batch], [r[3] for r in batch]))
            if not mine:
                raise Failed("a thread without batches")
            prepared.append(mine)
        results = [None] * len(prepared)
        before = self.snapshot()
        start = time.perf_counter_ns()
        deadline = start + int(seconds * 1e9)

        def worker(index):
            done = failed = transfers = nbytes = 0
            latencies, first = [], None
            i = 0
            batches = prepared[index]
            while time.perf_counter_ns() < deadline:
                op, lo, ro, ln = batches[i % len(batches)]
                i += 1
                t0 = time.perf_counter_ns()
                code = self.batch(peer, remote, op, lo, ro, ln)
                t1 = time.perf_counter_ns()
                if len(latencies) < MAX_LATENCIES:
                    latencies.append(t1 - t0)
                transfers += len(ln)
                if code == 0:
                    done += 1
                    nbytes += sum(ln)
                else:
                    failed += 1
                    first = first or f"batch_transfer_sync_{op} returned {code}"
            results[index] = (done, failed, transfers, nbytes, latencies, first)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(len(prepared))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter_ns() - start
        after = self.snapshot()
        return self.figures(results, wall, before, after)

    def layerwise(self, peer, remote, requests, compute_us, seconds):
        if not requests or any(not layers for layers in requests):
            raise Failed("a layerwise run without requests or layers")
        before = self.snapshot()
        start = time.perf_counter_ns()
        deadline = start + int(seconds * 1e9)
        done = failed = transfers = nbytes = 0
        latencies, first = [], None
        i = 0
        while time.perf_counter_ns() < deadline:
            layers = requests[i % len(requests)]
            i += 1
            t0 = time.perf_counter_ns()
            ids, ok = [], True
            for batch in layers:
                time.sleep(compute_us / 1e6)
                local = [self.memory + r[1] for r in batch]
                far = [remote + r[2] for r in batch]
                lengths = [r[3] for r in batch]
                transfers += len(lengths)
                nbytes += sum(lengths)
                batch_id = self.te.batch_transfer_async_write(peer, local, far, lengths)
                if batch_id == 0:
                    ok = False
                    first = first or "batch_transfer_async_write returned 0"
                else:
                    ids.append(batch_id)
            # Waits for every layer's batch (bounded by the wheel's transfer timeout), 0 when all completed.
            if ids:
                status = self.te.get_batch_transfer_status(ids)
                if status != 0:
                    ok = False
                    first = first or f"get_batch_transfer_status returned {status}"
            t1 = time.perf_counter_ns()
            if len(latencies) < MAX_LATENCIES:
                latencies.append(t1 - t0)
            if ok:
                done += 1
            else:
                failed += 1
                nbytes -= sum(r[3] for batch in layers for r in batch)
        wall = time.perf_counter_ns() - start
        after = self.snapshot()
        return self.figures([(done, failed, transfers, nbytes, latencies, first)], wall, before, after)

    @staticmethod
    def figures(results, wall, before, after):
        return {
            "wall_ns": wall,
            "batches": sum(r[0] + r[1] for r in results),
            "failed_batches": sum(r[1] for r in results),
            "transfers": sum(r[2] for r in results),
            "bytes": sum(r[3] for r in results),
            "latencies_ns": [x for r in results for x in r[4]],
            "first_failure": next((r[5] for r in results if r[5]), None),
            "before": before,
            "after": after,
        }

    def fill(self, seed):
        rng = random.Random(seed)
        for offset in range(0, self.size, CHUNK):
            self.to_device(offset, rng.randbytes(min(CHUNK, self.size - offset)))

    def digest(self):
        digest = hashlib.sha256()
        for offset in range(0, self.size, CHUNK):
            digest.update(self.from_device(offset, min(CHUNK, self.size - offset)))
        return digest.hexdigest()

    def copy_all(self, peer, remote, op):
        piece = 1 << 20
        offsets = list(range(0, self.size, piece))
        for at in range(0, len(offsets), 16):
            group = offsets[at : at + 16]
            lengths = [min(piece, self.size - o) for o in group]
            check(self.batch(peer, remote, op, group, group, lengths), f"batch_transfer_sync_{op} of the whole buffer")

    def quit(self):
        if self.te is not None and self.memory is not None:
            self.te.unregister_memory(self.memory)


def serve(role):
    side = Side()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            request = json.loads(line)
            cmd = request.get("cmd")
            if cmd == "init":
                answer = side.init(int(request["size"]), int(request["fill"]), request.get("evidence"))
            elif cmd == "snapshot":
                answer = side.snapshot()
            elif cmd == "run" and role == "initiator":
                answer = side.run(request["peer"], int(request["remote"]), request["lists"], float(request["seconds"]))
            elif cmd == "layerwise" and role == "initiator":
                answer = side.layerwise(
                    request["peer"],
                    int(request["remote"]),
                    request["requests"],
                    float(request["compute_us"]),
                    float(request["seconds"]),
                )
            elif cmd == "connect" and role == "initiator":
                peer, remote = request["peer"], int(request["remote"])
                check(side.batch(peer, remote, "read", [0], [0], [64]), "the first transfer (auto-connect)")
                answer = {}
            elif cmd == "batch" and role == "initiator":
                started = time.perf_counter_ns()
                rc = side.batch(
                    request["peer"],
                    int(request["remote"]),
                    request["op"],
                    request["locals"],
                    request["remotes"],
                    request["lengths"],
                )
                answer = {"rc": rc, "ms": (time.perf_counter_ns() - started) / 1e6}
            elif cmd == "fill":
                side.fill(int(request["seed"]))
                answer = {}
            elif cmd == "digest":
                answer = {"sha256": side.digest()}
            elif cmd == "copy_all" and role == "initiator":
                side.copy_all(request["peer"], int(request["remote"]), request["op"])
                answer = {}
            elif cmd == "quit":
                side.quit()
                print(json.dumps({"ok": True}), flush=True)
                return
            else:
                raise Failed(f"unknown command {cmd!r} for the {role}")
            answer["ok"] = True
        except Exception as error:  # every failure is answered, never a dead pipe
            answer = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] not in (["target"], ["initiator"]):
        raise SystemExit(__doc__)
    serve(sys.argv[1])
