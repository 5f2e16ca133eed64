"""Nothing is left in the temporary directory when processes are SIGKILLed:
not the launcher's job directory when the launcher is killed (its guardian removes it), not a
parameter server's Unix-socket directory when the server is killed (the launcher removes it)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "launcher_testlib", Path(__file__).parent / "scripts" / "launcher_testlib.py")
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

pytestmark = pytest.mark.timeout(60)

SLEEPER = "import time; time.sleep(60)"


@pytest.fixture
def tmpdir_env():
    """A short private TMPDIR for the job (Unix socket paths must stay short), removed after."""
    path = tempfile.mkdtemp(prefix="acc-t-", dir="/tmp")
    try:
        yield path
    finally:
        lib.kill_all(_processes_using(path))
        shutil.rmtree(path, ignore_errors=True)


def _processes_using(tmpdir: str) -> list[int]:
    """Every process whose environment has TMPDIR=tmpdir (the job's, nobody else's)."""
    needle = f"TMPDIR={tmpdir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if needle in fh.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _server_pid(tmpdir: str) -> int:
    for pid in _processes_using(tmpdir):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"accord.kvstore.server" in fh.read():
                    return pid
        except OSError:
            pass
    raise AssertionError("no parameter server process found")


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _left(tmpdir: str) -> list[str]:
    return sorted(str(p.relative_to(tmpdir)) for p in Path(tmpdir).rglob("*"))


def _start(tmpdir: str, *args: str):
    return lib.start_accordrun("--grace-period", "1", *args, lib.PYTHON, "-c", SLEEPER,
                               env=lib.cli_env(TMPDIR=tmpdir))


def test_a_sigkilled_launcher_leaves_no_job_directory(tmpdir_env):
    launcher = _start(tmpdir_env, "-np", "2", "--num-servers", "1")
    pids: list[int] = []
    try:
        _wait_for(lambda: list(Path(tmpdir_env).rglob("accord-kv-*/server.sock")), 20,
                  "the server's Unix socket")
        job_dirs = [p for p in Path(tmpdir_env).iterdir() if p.name.startswith("accord-")]
        assert job_dirs, _left(tmpdir_env)
        pids = _processes_using(tmpdir_env)
        launcher.kill()  # SIGKILL: no handler runs; the guardian must clean up
        launcher.communicate(timeout=10)
        assert lib.wait_dead(pids, 15) == []
        _wait_for(lambda: _left(tmpdir_env) == [], 10, f"an empty TMPDIR (left: {_left(tmpdir_env)})")
    finally:
        lib.reap(launcher, pids)


def test_a_sigkilled_parameter_server_leaves_no_socket_directory(tmpdir_env):
    launcher = _start(tmpdir_env, "-np", "1", "--num-servers", "1")
    pids: list[int] = []
    try:
        _wait_for(lambda: list(Path(tmpdir_env).rglob("accord-kv-*/server.sock")), 20,
                  "the server's Unix socket")
        pids = _processes_using(tmpdir_env)
        os.kill(_server_pid(tmpdir_env), signal.SIGKILL)
        out, err = launcher.communicate(timeout=20)
        assert launcher.returncode == 128 + signal.SIGKILL, err  # the server's death is the failure
        assert "server" in err
        assert lib.wait_dead(pids, 10) == []
        assert _left(tmpdir_env) == []
    finally:
        lib.reap(launcher, pids)
