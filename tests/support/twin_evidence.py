"""The twin runtime's evidence counts for the support scripts (mooncake_over_aiv.py, mooncake_store_over_aiv.py).

cannTwinEvidence (twin-only, not a CANN function) writes the counts in a layout that the loaded libascendcl.so
describes itself: cannTwinEvidenceLayout returns {"version", "size", "counts": [name, ...]} as JSON, from the one
definition in shmem-bindings/cann-twin/src/evidence.rs. The structure here is built from that answer (the header,
uint32 version, uint32 size, char runtime[32], then one uint64 per name in order); no name is listed here.

    reader = Reader(acl)      # acl: ctypes.CDLL of the twin's libascendcl.so
    reader.counts             # the names, in layout order
    reader.read()             # {name: count} now

    python twin_evidence.py LIBRARY
                              loads LIBRARY and prints {"version", "size", "counts", "read", "runtime"}: the layout it
                              exports, the size of the structure built from it, and one reading
"""

import ctypes
import json
import sys

HEADER = [("version", ctypes.c_uint32), ("size", ctypes.c_uint32), ("runtime", ctypes.c_char * 32)]


def layout(acl):
    """The layout the library exports (cannTwinEvidenceLayout), parsed."""
    try:
        function = acl.cannTwinEvidenceLayout
    except AttributeError:
        raise SystemExit("the loaded libascendcl.so has no cannTwinEvidenceLayout: not the twin runtime") from None
    function.argtypes = []
    function.restype = ctypes.c_char_p
    return json.loads(function().decode())


def structure(spec):
    """The ctypes structure of the layout `spec`; exits when its size is not the one `spec` gives."""

    class Evidence(ctypes.Structure):
        _fields_ = HEADER + [(str(name), ctypes.c_uint64) for name in spec["counts"]]

    if ctypes.sizeof(Evidence) != int(spec["size"]):
        raise SystemExit(f"the evidence layout builds {ctypes.sizeof(Evidence)} bytes, not its size {spec['size']}")
    return Evidence


class Reader:
    """Reads the counts of `acl` (the twin's libascendcl.so) in the layout it exports."""

    def __init__(self, acl):
        self.spec = layout(acl)
        self.counts = [str(name) for name in self.spec["counts"]]
        self.structure = structure(self.spec)
        self.function = acl.cannTwinEvidence
        self.function.argtypes = [ctypes.c_void_p]
        self.last = None

    def read(self):
        record = self.structure(version=int(self.spec["version"]), size=ctypes.sizeof(self.structure))
        code = self.function(ctypes.byref(record))
        if code != 0:
            raise SystemExit(f"cannTwinEvidence failed with {code}")
        self.last = record
        return {name: getattr(record, name) for name in self.counts}


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    reader = Reader(ctypes.CDLL(sys.argv[1]))
    read = reader.read()
    print(
        json.dumps(
            {
                "version": reader.spec["version"],
                "size": ctypes.sizeof(reader.structure),
                "counts": reader.counts,
                "read": read,
                "runtime": reader.last.runtime.decode(errors="replace"),
            }
        )
    )


if __name__ == "__main__":
    main()
