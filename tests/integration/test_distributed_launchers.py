"""One DDP script on ``init_process_group("accord")`` (env://) under the launchers users start it
with: accordrun, torchrun and mpirun train it to the same weights, bit for bit, and to the weights
computed here without any launcher; ``hvd.*`` beside it works under torchrun too; a rank killed in
the middle of a collective ends the job with that rank as the cause, under accordrun and torchrun.

The script is tests/integration/scripts/dist_ddp.py; each rank writes its result to a file.
"""
from __future__ import annotations

import importlib.util
import json
import re
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers.mpirun import mpi_ready, run_under_mpirun
from helpers.ports import held_port

_spec = importlib.util.spec_from_file_location(
    "launcher_testlib", Path(__file__).parent / "scripts" / "launcher_testlib.py")
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

SCRIPT = lib.script("dist_ddp.py")
SIZE, STEPS, LR = 2, 10, 0.1
pytestmark = pytest.mark.slow


def _torchrun(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    argv = [lib.PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(SIZE), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=lib.cli_env())


def _results(out: Path) -> list[dict]:
    found = sorted(out.glob("*.json"))
    assert [f.name for f in found] == [f"{r}.json" for r in range(SIZE)], found
    return [json.loads(f.read_text()) for f in found]


def _expected_weights() -> list[np.ndarray]:
    """The script's training in one process: rank 0's initial weights (DDP broadcasts them), each
    step the mean of the ranks' gradients."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    for step in range(STEPS):
        grads = []
        for rank in range(SIZE):
            g = torch.Generator().manual_seed(1000 * rank + step)
            x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
            model.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p -= LR * sum(g[i] for g in grads) / SIZE
    return [p.detach().reshape(-1).numpy() for p in model.parameters()]


def _weights(result: dict) -> list[np.ndarray]:
    return [np.array(w, dtype="float32") for w in result["weights"]]


@pytest.fixture(scope="module")
def expected():
    return _expected_weights()


def _check_trained(results: list[dict], expected: list[np.ndarray]) -> list[np.ndarray]:
    assert [(r["rank"], r["world"]) for r in results] == [(0, SIZE), (1, SIZE)]
    first = _weights(results[0])
    for result in results:
        got = _weights(result)
        assert _same(got, first), "the ranks' weights differ"
        for a, b in zip(got, expected):  # another process: its kernels may round differently
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return first


def _same(got: list[np.ndarray], reference: list[np.ndarray]) -> bool:
    return all(a.tobytes() == b.tobytes() for a, b in zip(got, reference))


@pytest.fixture(scope="module")
def under_accordrun(tmp_path_factory, expected):
    """The script's weights under accordrun (the others are compared with them)."""
    out = tmp_path_factory.mktemp("accordrun")
    proc = lib.accordrun("-np", str(SIZE), lib.PYTHON, SCRIPT, "--out", str(out), timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _check_trained(_results(out), expected)


@pytest.mark.timeout(150)
def test_ddp_on_accord_under_accordrun_trains_to_the_expected_weights(under_accordrun):
    assert len(under_accordrun) == 4  # both layers' weights and biases


@pytest.mark.timeout(150)
def test_ddp_on_accord_under_torchrun_reaches_accordruns_weights(tmp_path, expected, under_accordrun):
    proc = _torchrun(SCRIPT, "--out", str(tmp_path), timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _same(_check_trained(_results(tmp_path), expected), under_accordrun)


@pytest.mark.mpi
@pytest.mark.timeout(150)
@pytest.mark.skipif(not mpi_ready(), reason="needs mpirun and mpi4py")
def test_ddp_on_accord_under_mpirun_reaches_accordruns_weights(tmp_path, expected, under_accordrun):
    # env:// under mpirun: the script takes RANK and WORLD_SIZE from Open MPI's variables, the
    # store's address is given here
    proc = run_under_mpirun(SCRIPT, SIZE, "--out", str(tmp_path), timeout=100,
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(held_port()))
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert _same(_check_trained(_results(tmp_path), expected), under_accordrun)


@pytest.mark.timeout(120)
def test_hvd_beside_the_accord_group_under_torchrun(tmp_path, expected):
    proc = _torchrun(SCRIPT, "--out", str(tmp_path), "--hvd", "first", timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = _results(tmp_path)
    _check_trained(results, expected)
    assert [r["hvd_sum"] for r in results] == [3.0, 3.0]


# The collective timeout (init_process_group's) is far longer than the tests' timeouts: a job that
# waited it out would fail the test by timing out.
@pytest.mark.timeout(120)
def test_a_rank_killed_mid_collective_under_accordrun_ends_the_job_naming_it(tmp_path, killed_tmpdir):
    proc = lib.accordrun("-np", str(SIZE), lib.PYTHON, SCRIPT, "--out", str(tmp_path), "--die-rank", "1",
                         timeout=100, env=lib.cli_env(TMPDIR=killed_tmpdir))
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr[-3000:]
    assert "Root Cause (first observed failure):" in proc.stderr, proc.stderr[-3000:]
    cause = proc.stderr.split("Root Cause (first observed failure):", 1)[1]
    assert "rank       : 1 (local_rank 1, host localhost)" in cause, cause
    assert "killed by SIGKILL (signal 9)" in cause, cause
    assert "went on although" not in proc.stdout + proc.stderr


@pytest.mark.timeout(120)
def test_a_rank_killed_mid_collective_under_torchrun_fails_the_job_naming_it(tmp_path):
    proc = _torchrun(SCRIPT, "--out", str(tmp_path), "--die-rank", "1", timeout=100)
    assert proc.returncode != 0
    # torchrun's summary lists every failed rank; the killed one with its signal (-9)
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)\s*\n\s*exitcode\s*: -9\b", proc.stderr), proc.stderr[-3000:]
    assert "Signal 9 (SIGKILL) received by PID" in proc.stderr
    assert "went on although" not in proc.stdout + proc.stderr
