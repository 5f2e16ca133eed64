"""Running accordrun (and other commands) on the simulated hosts of tests/cluster."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

PYTHON = sys.executable
ACCORDRUN = str(Path(sys.executable).parent / "accordrun")
SCRIPTS = Path(__file__).resolve().parents[1] / "cluster" / "scripts"
REPO = Path(__file__).resolve().parents[2]


def script(name: str) -> str:
    """Absolute path of a worker script in tests/cluster/scripts (on the shared code folder)."""
    return str(SCRIPTS / name)


def job_env(**extra: str) -> dict[str, str]:
    """The environment of a launcher started in a test: clean, one thread per worker."""
    from simcluster import Cluster

    return Cluster.env({"OMP_NUM_THREADS": "1", **extra})


def accordrun(cluster: Any, *args: str, host: str = "h1", timeout: float = 180,
              cwd: str | Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """``accordrun args`` run inside ``host`` (the login node) to completion."""
    return cluster.run(host, [ACCORDRUN, *args], timeout=timeout, cwd=str(cwd or REPO), env=job_env(**env))


def start_accordrun(cluster: Any, *args: str, host: str = "h1", cwd: str | Path | None = None,
                    **env: str) -> subprocess.Popen[str]:
    """``accordrun args`` started inside ``host``; output piped as text."""
    return cluster.popen(host, [ACCORDRUN, *args], cwd=str(cwd or REPO), env=job_env(**env),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def reports(text: str, tag: str = "REPORT") -> dict[int, dict[str, Any]]:
    """``{rank: json}`` from worker lines ``[r]<stdout>:TAG {...}`` (or unprefixed ``TAG {...}``)."""
    found = {}
    for line in text.splitlines():
        match = re.search(rf"{tag} (\{{.*\}})\s*$", line)
        if match:
            data = json.loads(match.group(1))
            found[data["rank"]] = data
    return found


def wait_for_files(paths: list[Path], timeout: float, proc: subprocess.Popen[Any] | None = None) -> None:
    """Wait until every path exists; fail early (with the output) if ``proc`` ends first."""
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the job ended ({proc.returncode}) before {paths} appeared:\n{out}\n{err}")
        if time.monotonic() > deadline:
            pytest.fail(f"not all of {paths} appeared within {timeout}s")
        time.sleep(0.1)


def check_idle(cluster: Any, timeout: float = 15.0) -> None:
    """Fail the test if anything but sshd still runs on a host once ``timeout`` has passed
    (after killing it, so that the next test starts clean)."""
    left = cluster.wait_idle(timeout=timeout)
    for procs in left.values():
        for pid, _ in procs:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if left:
        pytest.fail(f"processes left running on the simulated hosts: {left}")
