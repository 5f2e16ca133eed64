"""Run the framework integration scripts (tests/integration/scripts) as real jobs: under accordrun,
torchrun (``python -m torch.distributed.run``) or ``accelerate launch``, with a hard timeout.

A test module that needs a framework calls :func:`require` first: without the package the module
is skipped with the reason and the install line (scripts/setup_env.sh installs them in .venv).
Nothing here imports the frameworks: a job's processes do.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from helpers.ports import held_port

SCRIPTS = Path(__file__).resolve().parents[1] / "integration" / "scripts"
PYTHON = sys.executable


def require(module: str, install: str) -> None:
    """Skip the calling test module unless ``module`` is installed (looked up, not imported)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        pytest.skip(f"{module} is not installed here ({install}; scripts/setup_env.sh installs it in .venv)",
                    allow_module_level=True)


def common() -> ModuleType:
    """The scripts' shared plain-torch module (data, model, reference training)."""
    spec = importlib.util.spec_from_file_location("integration_common", SCRIPTS / "framework_common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(argv: list[str], timeout: float, cwd: str | Path = SCRIPTS,
        env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a launcher command in ``cwd`` (the scripts' folder) and return it completed; on timeout
    its whole process group is stopped (TERM, then KILL) and the test fails with the output's end."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    env.pop("PYTEST_CURRENT_TEST", None)
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail(f"{' '.join(argv)} ran past {timeout} s; its output ended with:\n{out[-6000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, "")


def accordrun(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``accordrun -np 2 python SCRIPT ARGS``."""
    return run([PYTHON, "-m", "accord.run", "-np", "2", PYTHON, script, *args], timeout)


def torchrun(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node 2 SCRIPT ARGS`` (a free port of its own)."""
    return run([PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script, *args],
               timeout)


def accelerate_launch(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``accelerate launch`` with 2 processes (torchrun underneath, CPU processes included)."""
    return run([PYTHON, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(held_port()), script, *args], timeout)


def succeeded(proc: subprocess.CompletedProcess[str]) -> None:
    """Fail the test, with the output's end, unless the job exited 0."""
    assert proc.returncode == 0, f"{' '.join(proc.args)} exited {proc.returncode}:\n{proc.stdout[-6000:]}"


def max_difference(a: dict[str, list[float]], b: dict[str, list[float]]) -> float:
    """The largest difference between two sets of weights (same names and sizes)."""
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max(abs(x - y) for name in a for x, y in zip(a[name], b[name], strict=True))
