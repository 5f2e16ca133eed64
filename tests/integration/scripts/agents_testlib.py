"""Helpers for the one-agent-per-node tests: several ``accordrun`` agents as separate processes
on this host (loopback), each with its own arguments and environment."""
from __future__ import annotations

import importlib.util
import os
import re
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import Sequence

from helpers.ports import held_port

_spec = importlib.util.spec_from_file_location("launcher_testlib", Path(__file__).parent / "launcher_testlib.py")
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)


def free_port() -> int:
    """A port free on loopback, held from other processes until this one ends."""
    return held_port()


def secret_file(folder: Path, name: str = "secret") -> str:
    """A fresh 0600 secret file in ``folder``."""
    path = folder / name
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return str(path)


def start_agents(argvs: Sequence[Sequence[str]], envs: Sequence[dict[str, str]] | None = None,
                 cwd: str | None = None) -> list[subprocess.Popen[str]]:
    """Start one ``python -m accord.run`` per argv, each in its own session."""
    envs = envs or [lib.cli_env() for _ in argvs]
    return [subprocess.Popen([lib.PYTHON, "-m", "accord.run", *argv], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, start_new_session=True)
            for argv, env in zip(argvs, envs)]


def finish(procs: Sequence[subprocess.Popen[str]], timeout: float) -> list[subprocess.CompletedProcess[str]]:
    """Wait for every agent (``timeout`` in all); on timeout SIGTERM, then SIGKILL, the stragglers
    and raise AssertionError with their output."""
    deadline = time.monotonic() + timeout
    done = []
    late = False
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            late = True
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                out, err = proc.communicate(timeout=15)
            except (subprocess.TimeoutExpired, OSError):
                proc.kill()
                out, err = proc.communicate()
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    if late:
        raise AssertionError("agents did not finish in time:\n" + "\n".join(
            f"--- agent {i} rc={c.returncode}\n{c.stdout[-3000:]}\n{c.stderr[-3000:]}" for i, c in enumerate(done)))
    return done


def run_agents(argvs: Sequence[Sequence[str]], timeout: float = 60, envs: Sequence[dict[str, str]] | None = None,
               cwd: str | None = None) -> list[subprocess.CompletedProcess[str]]:
    """Start the agents and wait for all of them."""
    return finish(start_agents(argvs, envs, cwd), timeout)


def agent_args(nnodes: int | str, rank: int | None, nproc: int, port: int, secret: str, *extra: str) -> list[str]:
    """An agent's flags (``rank`` None: no --node-rank)."""
    args = ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--secret-file", secret, "--start-timeout", "20"]
    if rank is not None:
        args += ["--node-rank", str(rank)]
    return args + list(extra)


def results(stdout: str, tag: str = "RESULT") -> dict[int, dict]:
    """``[rank]<stdout>:TAG {...}`` lines by rank (the last one of each rank)."""
    import json

    found = {}
    for line in stdout.splitlines():
        match = re.match(r"\[(\d+)\]<stdout>:" + tag + r" (\{.*\})$", line)
        if match:
            found[int(match.group(1))] = json.loads(match.group(2))
    return found
