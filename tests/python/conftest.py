"""Shared pieces of the Python drop-in's test suite.

The engine under test is chosen by env AIV_PYTEST_ENGINE: `aiv_transport` (default, this project's PyO3 package) or
`mooncake` (the real `mooncake-transfer-engine-non-cuda` wheel, tcp only). Every test of Mooncake's API runs against
both, so the suite encodes what the real Mooncake does; tests of this project's extensions (device memory, the
`ascend`/`aiv` protocols) are skipped under `mooncake` with the reason.

Prerequisites and where they come from (missing ones skip the tests that need them through `missing`, naming what is
missing, except with CI=true, where a missing prerequisite fails):
  - the engine module: `aiv_transport` (the wheel built from this repository with maturin) or, under
    AIV_PYTEST_ENGINE=mooncake, `mooncake.engine` (tests/support/mooncake.sh makes a virtualenv with it);
  - numpy (for the numpy-buffer test), installed in the interpreter running pytest;
  - AIV_TEST_MOONCAKE_VENV: a virtualenv with the real Mooncake wheel, for the interop tests
    (tests/support/mooncake.sh);
  - AIV_TEST_ETCD: an etcd endpoint host:port, for the etcd metadata tests (tests/support/etcd.sh start);
  - AIV_TEST_AIV_BIN or target/debug/aiv: this project's `aiv` binary, whose `metadata-server` serves the HTTP
    metadata tests (`cargo build --bin aiv`).

Skipped tests: every one, for whatever reason, gets a line `SKIPPED: <test id>: <reason>` in the closing summary
(`pytest_terminal_summary` below; pytest itself shows a skip only as an `s` unless asked with -rs), the convention of
the Rust tests too (docs/ARCHITECTURE.md, "Tests"). A test of an aiv_transport extension under
AIV_PYTEST_ENGINE=mooncake (`ours_only`) is skipped even with CI=true: the engine under test lacks it, nothing is
missing.

Seeds: every random choice comes from random.Random(seed) with seed derived from AIV_PYTEST_SEED (random when unset)
and the test's id; a failing test's report names both.
"""

import ctypes
import faulthandler
import hashlib
import mmap
import os
import queue
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PEER = HERE / "peer.py"
sys.path.insert(0, str(HERE))
from peer import first_difference, pattern  # noqa: E402, F401  (shared with the peer process and the tests)

ENGINE = os.environ.get("AIV_PYTEST_ENGINE", "aiv_transport")
IS_MOONCAKE = ENGINE == "mooncake"
CI = os.environ.get("CI") == "true"
HOST = "127.0.0.1"
# Mooncake's Python engine reads MC_TRANSFER_TIMEOUT (seconds, at least 5) when a TransferEngine is constructed; the
# default is 30. Small here so that a failing transfer cannot stall the suite; the peers inherit it.
os.environ.setdefault("MC_TRANSFER_TIMEOUT", "5")
TRANSFER_TIMEOUT = max(5.0, float(os.environ["MC_TRANSFER_TIMEOUT"]))
# Bounds for the harness itself: a peer must print READY within PEER_START seconds and answer a command within
# PEER_REPLY seconds.
PEER_START = 20.0
PEER_REPLY = 20.0
# No test may take longer than this: past it the process prints every thread's stack and exits (a call stuck in the
# engine's native code cannot be interrupted any other way). The children die with it (die_with_parent).
TEST_LIMIT = 90.0
BASE_SEED = int(os.environ.get("AIV_PYTEST_SEED") or random.SystemRandom().randrange(1 << 32))

if ENGINE not in ("aiv_transport", "mooncake"):
    raise pytest.UsageError(f"AIV_PYTEST_ENGINE={ENGINE!r}: expected aiv_transport or mooncake")


def missing(what: str, provider: str):
    """Skip (or, with CI=true, fail) because a prerequisite is missing: the one way a test of this suite skips for
    something missing (its SKIPPED line comes from pytest_terminal_summary)."""
    message = f"missing {what}; {provider}"
    if CI:
        pytest.fail(f"{message} (CI=true: a missing prerequisite is a failure)", pytrace=False)
    pytest.skip(message)


def ours_only(what: str):
    """Skip under AIV_PYTEST_ENGINE=mooncake: the test needs this project's extension `what`."""
    if IS_MOONCAKE:
        pytest.skip(f"needs {what}, an aiv_transport extension the real Mooncake engine lacks")


def pytest_terminal_summary(terminalreporter):
    """A `SKIPPED: <test id>: <reason>` line per skipped test, whatever skipped it."""
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        terminalreporter.write_line(f"SKIPPED: {report.nodeid}: {reason.removeprefix('Skipped: ')}")


# ---------------------------------------------------------------------------------------------------------------
# seeds


def pytest_report_header(config):
    return f"engine: {ENGINE}; AIV_PYTEST_SEED={BASE_SEED}; MC_TRANSFER_TIMEOUT={os.environ['MC_TRANSFER_TIMEOUT']}"


def seed_for(nodeid: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{BASE_SEED}/{nodeid}".encode()).digest()[:4], "little")


@pytest.fixture
def rng(request):
    """A random.Random seeded from AIV_PYTEST_SEED and the test id (both printed when the test fails)."""
    return random.Random(seed_for(request.node.nodeid))


@pytest.fixture(autouse=True)
def bounded_test():
    faulthandler.dump_traceback_later(TEST_LIMIT, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


_prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the forked child only calls it


def die_with_parent():
    """preexec_fn for children: Linux sends them SIGKILL when the pytest process dies, however it dies."""
    PR_SET_PDEATHSIG = 1
    _prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.sections.append(
            ("seed", f"AIV_PYTEST_SEED={BASE_SEED} (this test's seed {seed_for(item.nodeid)}) reproduces the data")
        )


# ---------------------------------------------------------------------------------------------------------------
# the engine module


class EngineModule:
    def __init__(self, module, TransferEngine, TransferOpcode):
        self.module = module
        self.TransferEngine = TransferEngine
        self.TransferOpcode = TransferOpcode


def load_engine():
    if IS_MOONCAKE:
        try:
            import mooncake.engine as module
        except ImportError as error:
            missing(
                f"the real Mooncake engine (import mooncake.engine: {error})",
                "tests/support/mooncake.sh makes a virtualenv with it; run pytest with that virtualenv's python",
            )
    else:
        try:
            import aiv_transport as module
        except ImportError as error:
            missing(
                f"the aiv_transport package (import: {error})",
                "build this repository's wheel with maturin and pip-install it into the virtualenv running pytest",
            )
    opcode = getattr(module, "TransferOpcode", None) or module.TransferEngine.TransferOpcode
    return EngineModule(module, module.TransferEngine, opcode)


@pytest.fixture(scope="session")
def te():
    return load_engine()


def free_port() -> int:
    """A TCP port on loopback the OS reports free (nothing listens there once this returns)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def local_name(conn: str) -> str:
    """local_hostname for initialize(): the host under P2PHANDSHAKE, a fresh unique segment name otherwise."""
    return HOST if conn == "P2PHANDSHAKE" else f"{HOST}:{free_port()}"


def new_engine(te, conn: str, protocol: str = "tcp"):
    engine = te.TransferEngine()
    rc = engine.initialize(local_name(conn), conn, protocol, "")
    assert rc == 0, f"initialize(..., {conn!r}, {protocol!r}, '') returned {rc}"
    return engine


# ---------------------------------------------------------------------------------------------------------------
# local buffers


class HostArena:
    """Anonymous mmap memory at an `align`-aligned address (the initiator's side of a transfer)."""

    def __init__(self, size: int, align: int = 4096):
        self.map = mmap.mmap(-1, size + align)
        raw = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.addr = -(-raw // align) * align
        self.size = size

    def write(self, offset: int, data: bytes) -> None:
        assert 0 <= offset and offset + len(data) <= self.size
        ctypes.memmove(self.addr + offset, data, len(data))

    def read(self, offset: int, length: int) -> bytes:
        assert 0 <= offset and offset + length <= self.size
        return ctypes.string_at(self.addr + offset, length)


class DeviceArena:
    """Twin-runtime device memory from aiv_transport's allocate_device_buffer, reached through the engine."""

    def __init__(self, engine, size: int, align: int = 4096):
        self.engine = engine
        self.raw = engine.allocate_device_buffer(size + align)
        assert self.raw != 0, f"allocate_device_buffer({size + align}) returned 0"
        self.addr = -(-self.raw // align) * align
        self.size = size

    def write(self, offset: int, data: bytes) -> None:
        assert 0 <= offset and offset + len(data) <= self.size
        rc = self.engine.write_bytes_to_buffer(self.addr + offset, data, len(data))
        assert rc == 0, f"write_bytes_to_buffer returned {rc}"

    def read(self, offset: int, length: int) -> bytes:
        assert 0 <= offset and offset + length <= self.size
        return bytes(self.engine.read_bytes_from_buffer(self.addr + offset, length))

    def free(self) -> None:
        self.engine.free_device_buffer(self.raw)


def assert_bytes(got: bytes, want: bytes, what: str) -> None:
    """Equal bytes, else an assertion naming the first differing index (not a multi-MiB diff)."""
    diff = first_difference(got, want)
    if diff >= 0:
        g = got[diff : diff + 8].hex()
        w = want[diff : diff + 8].hex()
        raise AssertionError(f"{what}: first difference at byte {diff} of {len(want)} (got {g}..., want {w}...)")


# ---------------------------------------------------------------------------------------------------------------
# the peer process


class Peer:
    """tests/python/peer.py in a subprocess: a target (and, for interop, an initiator) driven over stdin/stdout."""

    def __init__(
        self,
        metadata: str,
        *,
        size: int,
        memory: str = "host",
        protocol: str = "tcp",
        regions: int = 1,
        align: int = 4096,
        fill=None,
        python=None,
        engine=None,
        lifetime: float = 120.0,
        name=None,
    ):
        cmd = [
            python or sys.executable,
            str(PEER),
            "--metadata",
            metadata,
            "--protocol",
            protocol,
            "--host",
            HOST,
            "--size",
            str(size),
            "--memory",
            memory,
            "--regions",
            str(regions),
            "--align",
            str(align),
            "--timeout",
            str(lifetime),
        ]
        if metadata != "P2PHANDSHAKE":
            cmd += ["--name", name or local_name(metadata)]
        if fill is not None:
            cmd += ["--fill", str(fill)]
        env = dict(os.environ, AIV_PYTEST_ENGINE=engine or ENGINE)
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
            text=True,
            bufsize=1,
            preexec_fn=die_with_parent,
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        line = self._line(PEER_START, "READY")
        words = line.split()
        if len(words) != 4 or words[0] != "READY":
            self.kill()
            raise AssertionError(f"peer did not start ({' '.join(cmd[1:])}): {line!r}\n{self.log()}")
        self.session, self.addr, self.span = words[1], int(words[2]), int(words[3])
        self.stride = -(-size // align) * align

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _line(self, timeout: float, waiting_for: str) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"peer gave no {waiting_for} within {timeout} s\n{self.log()}") from None
        if line is None:
            raise AssertionError(f"peer exited (rc {self.proc.poll()}) waiting for {waiting_for}\n{self.log()}")
        return line

    def log(self, limit: int = 4000) -> str:
        self.stderr.seek(0)
        return "peer stderr (tail):\n" + self.stderr.read().decode(errors="replace")[-limit:]

    def ask(self, command: str, timeout: float = PEER_REPLY) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._line(timeout, f"an answer to {command!r}")

    def fill(self, seed: int) -> None:
        assert self.ask(f"fill {seed}") == "ok"

    def check(self, kind: str, seed: int, offset: int, length: int, what: str) -> None:
        answer = self.ask(f"{kind} {seed} {offset} {length}")
        assert answer == "ok", f"{what}: peer's {kind} {seed} {offset} {length} answered {answer!r}"

    def verify(self, seed: int, offset: int, length: int, what: str = "peer memory") -> None:
        """The peer's span[offset:offset+length] holds pattern(seed, length)."""
        self.check("verify", seed, offset, length, what)

    def same(self, seed: int, offset: int, length: int, what: str = "peer memory") -> None:
        """The peer's span[offset:offset+length] still holds its slice of pattern(seed, span) (the fill)."""
        self.check("same", seed, offset, length, what)

    def rc(self, command: str, timeout: float = PEER_REPLY) -> int:
        """An initiator command run by the peer (put/get/bput/bget); returns the engine's return code."""
        answer = self.ask(command, timeout)
        match = re.fullmatch(r"rc (-?\d+)", answer)
        assert match, f"peer answered {answer!r} to {command!r}"
        return int(match.group(1))

    def hang_up(self) -> None:
        """Close the peer's stdin: it exits (close() waits for that)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def close(self) -> None:
        if self.proc.poll() is None:
            self.hang_up()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.stderr.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def peers():
    """Start peers with peers(...); every one is closed (or killed) when the test ends."""
    started = []

    def start(*args, **kwargs):
        peer = Peer(*args, **kwargs)
        started.append(peer)
        return peer

    yield start
    close_all(started)


def close_all(peers) -> None:
    """Hang up on every peer first, then wait for each, so their shutdowns overlap."""
    for peer in peers:
        peer.hang_up()
    for peer in peers:
        peer.close()


# ---------------------------------------------------------------------------------------------------------------
# metadata services


def aiv_binary():
    path = os.environ.get("AIV_TEST_AIV_BIN") or str(REPO / "target" / "debug" / "aiv")
    return path if os.access(path, os.X_OK) else None


@pytest.fixture(scope="session")
def http_metadata():
    """`aiv metadata-server` on a port the OS picks; yields its connection string http://127.0.0.1:PORT/metadata."""
    binary = aiv_binary()
    if binary is None:
        missing(
            "this project's aiv binary for the HTTP metadata server",
            "set AIV_TEST_AIV_BIN to it or run `cargo build --bin aiv` (target/debug/aiv)",
        )
    proc = subprocess.Popen(
        [binary, "metadata-server", "--host", HOST, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        preexec_fn=die_with_parent,
    )
    lines = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    url = None
    deadline = time.monotonic() + 15
    while url is None and time.monotonic() < deadline:
        try:
            match = re.search(r"(http://\S+/metadata)", lines.get(timeout=max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            break
        url = match and match.group(1)
    if url is None:
        proc.kill()
        raise AssertionError("aiv metadata-server did not print its URL within 15 s")
    yield url
    proc.kill()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def etcd_metadata():
    endpoint = os.environ.get("AIV_TEST_ETCD")
    if not endpoint:
        missing(
            "AIV_TEST_ETCD (an etcd endpoint host:port)",
            "tests/support/etcd.sh start provides one: "
            'export AIV_TEST_ETCD="$(tests/support/etcd.sh start | tail -n 1)"',
        )
    return f"etcd://{endpoint}"


METADATA_KINDS = ["p2p", "http", "etcd"]


@pytest.fixture(scope="session")
def metadata_for(request):
    """metadata_for(kind) -> the connection string of kind p2p, http or etcd (starting what it needs)."""

    def get(kind):
        if kind == "p2p":
            return "P2PHANDSHAKE"
        return request.getfixturevalue(f"{kind}_metadata")

    return get


def mooncake_python():
    venv = os.environ.get("AIV_TEST_MOONCAKE_VENV")
    if not venv:
        missing(
            "AIV_TEST_MOONCAKE_VENV (a virtualenv with the real Mooncake wheel)",
            'tests/support/mooncake.sh provides one: export AIV_TEST_MOONCAKE_VENV="$(tests/support/mooncake.sh)"',
        )
    python = Path(venv) / "bin" / "python"
    if not os.access(python, os.X_OK):
        missing(
            f"a python in AIV_TEST_MOONCAKE_VENV ({python} is not executable)", "tests/support/mooncake.sh makes it"
        )
    return str(python)
