"""Helpers shared by the launcher integration tests (imported by file path, not installed)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
PYTHON = sys.executable


def cli_env(**changes: str | None) -> dict[str, str]:
    """A copy of this process's environment for the launcher, with ``changes`` (None removes)."""
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    env.setdefault("OMP_NUM_THREADS", "1")
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def accordrun(*args: str, timeout: float = 30, env: dict[str, str] | None = None,
              cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m accord.run ARGS`` and return its completed process (text output).

    On timeout the launcher gets SIGTERM first (it stops its workers and removes its job
    directory), SIGKILL only if that does not end it; then TimeoutExpired is raised.
    """
    argv = [PYTHON, "-m", "accord.run", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env or cli_env(), cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise subprocess.TimeoutExpired(argv, timeout, out, err) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def start_accordrun(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start the launcher in its own session (so a test can signal it like a terminal would)."""
    return subprocess.Popen([PYTHON, "-m", "accord.run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env or cli_env(),
                            start_new_session=True)


def script(name: str) -> str:
    """Path of a worker script in this folder."""
    return str(SCRIPTS / name)


def env_reports(stdout: str) -> dict[int, dict]:
    """Parse report.py's ``[rank]<stdout>:ENV {...}`` lines, keyed by rank."""
    found = {}
    for line in stdout.splitlines():
        if "ENV {" in line:
            data = json.loads(line.split("ENV ", 1)[1])
            found[int(data["ACCORD_RANK"])] = data
    return found


def alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_for_pids(pid_dir: Path, ranks: int, timeout: float = 10.0) -> list[int]:
    """Wait until fail.py wrote every rank's pid file; return all pids."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = [pid_dir / f"{r}.pids" for r in range(ranks)]
        if all(f.exists() for f in files):
            return [int(p) for f in files for p in f.read_text().split()]
        time.sleep(0.05)
    raise AssertionError(f"workers did not start within {timeout}s: {sorted(os.listdir(pid_dir))}")


def wait_dead(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Wait until none of ``pids`` is alive; return the survivors at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        survivors = [p for p in pids if alive(p)]
        if not survivors:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def kill_all(pids: list[int]) -> None:
    """Test cleanup: SIGKILL whatever is still alive."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def reap(launcher, pids: list[int]) -> None:
    """Test cleanup: kill the launcher if it still runs, then whatever of ``pids`` is alive."""
    if launcher.poll() is None:
        launcher.kill()
        launcher.communicate()
    kill_all(pids)
