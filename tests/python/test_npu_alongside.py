"""Mooncake's real Ascend build (`mooncake-transfer-engine-npu`) and this engine in one process, on the same
twin-runtime device memory.

The host process (tests/python/npu_alongside.py, in Mooncake's CPython 3.11 virtualenv) runs both engines over one
loaded copy of the twin runtime: Mooncake's `ascend_transport.so` links the twin's `libascendcl.so` from
LD_LIBRARY_PATH, and this engine's `cann` backend (`"device_backend": "cann"`) loads that same file. Its device
buffers come from aiv_transport (SHMEM heap memory) and are registered with both engines. A second process runs
Mooncake's engine only: it reads what aiv_transport wrote, writes over it with Mooncake (aiv_transport then checks
it), and reads what aiv_transport's aiv path moved inside the host process.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HERE, die_with_parent, missing, ours_only

SCRIPT = HERE / "npu_alongside.py"
SIZE = 1 << 20
REPLY = 60.0


def prerequisites():
    ours_only("aiv_transport's cann backend on the twin runtime's libraries")
    venv = os.environ.get("AIV_TEST_MOONCAKE_NPU_VENV")
    libs = os.environ.get("AIV_TEST_TWIN_CANN_LIBS")
    if not venv or not Path(venv, "bin", "python").exists():
        missing("AIV_TEST_MOONCAKE_NPU_VENV (Mooncake's Ascend wheel)", "tests/support/mooncake_npu.sh makes it")
    if not libs or not Path(libs, "libascendcl.so").exists():
        missing("AIV_TEST_TWIN_CANN_LIBS (the twin's CANN libraries)", "tests/support/twin_cann_libs.sh builds them")
    return Path(venv, "bin", "python"), Path(libs)


def package_copy(tmp_path: Path) -> Path:
    """A directory holding only the aiv_transport package this suite tests (abi3, so it loads in the 3.11 venv)."""
    import aiv_transport

    root = tmp_path / "pythonpath"
    shutil.copytree(Path(aiv_transport.__file__).parent, root / "aiv_transport")
    return root


class Child:
    def __init__(self, argv, env):
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=die_with_parent,
        )

    def line(self, what: str) -> str:
        import selectors

        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        if not selector.select(REPLY):
            self.fail(f"no {what} within {REPLY} s")
        line = self.process.stdout.readline().strip()
        if not line:
            self.fail(f"ended before {what}")
        return line

    def send(self, text: str):
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()

    def fail(self, why: str):
        self.process.kill()
        _, err = self.process.communicate(timeout=10)
        pytest.fail(f"{why}; stderr:\n{err[-4000:]}")

    def finish(self, what: str):
        try:
            _, err = self.process.communicate(timeout=REPLY)
        except subprocess.TimeoutExpired:
            self.fail(f"{what} did not exit")
        assert self.process.returncode == 0, f"{what} exited with {self.process.returncode}:\n{err[-4000:]}"


def test_mooncake_ascend_build_alongside_aiv_transport_on_one_twin_device(tmp_path, rng):
    python, libs = prerequisites()
    config = tmp_path / "mooncake.json"
    config.write_text('{"aiv": {"device_backend": "cann"}}')
    runtime = str(libs / "libascendcl.so")
    env = dict(
        os.environ,
        LD_LIBRARY_PATH=str(libs),
        PYTHONPATH=str(package_copy(tmp_path)),
        MOONCAKE_CONFIG_PATH=str(config),
        AIV_ASCENDCL_LIB=runtime,
        AIV_SHMEM_LIB=runtime,
        AIV_HIXL_LIB=runtime,
    )
    env.pop("AIV_TRANSPORT_AS_MOONCAKE", None)
    seed = rng.randrange(1 << 30)
    host = Child([str(python), str(SCRIPT), "host", str(seed), str(SIZE)], env)
    words = host.line("READY").split()
    assert words[0] == "READY" and len(words) == 5, words
    name, x, y = words[1], words[2], words[3]
    peer = Child([str(python), str(SCRIPT), "peer", name, x, y, str(SIZE), str(seed)], env)
    wrote = peer.line("WROTE").split()
    assert wrote[0] == "WROTE", wrote
    # What Mooncake wrote into X is what aiv_transport reads there ...
    host.send(f"EXPECT X {wrote[1]}")
    assert host.line("EXPECTED") == "EXPECTED ok"
    # ... and a mismatch would be reported (the check can fail).
    host.send("EXPECT X " + "0" * 64)
    assert host.line("EXPECTED") == "EXPECTED mismatch"
    # aiv_transport's aiv path moves X to Y in the same device memory; Mooncake reads Y from the other process.
    host.send("MOVE")
    assert host.line("MOVED") == "MOVED 0"
    peer.send("CHECK Y")
    assert peer.line("PEER ok") == "PEER ok"
    peer.finish("the Mooncake-only process")
    host.send("QUIT")
    host.finish("the process with both engines")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
