"""The GPU tests' own checks, run on the CPU in every test run (ACCORD_GPU_TESTS_ON_CPU=1).

tests/gpu only runs where a GPU is lent, which is rare: a helper there that no longer matches
accord's API (a renamed function, a changed signature) would only show up then, wasting the
lent minutes. Running the same checks here on CPU tensors (Gloo/shm instead of NCCL, the
CUDA-only stream checks skipped) keeps them in step with the code. It proves nothing about CUDA.
"""
import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: tests/gpu runs for real")]


def test_gpu_checks_pass_on_cpu_tensors():
    env = {**os.environ, "ACCORD_GPU_TESTS_ON_CPU": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "gpu",
                           "-rs", "tests/gpu"], capture_output=True, text=True, timeout=280, cwd=ROOT, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    summary = re.search(r"(\d+) passed(?:, (\d+) skipped)?", out)
    assert summary, out[-3000:]
    # every test that does not need CUDA itself ran: the collectives, training and sharing checks
    assert int(summary.group(1)) >= 4, out[-3000:]
    skipped = re.findall(r"SKIPPED \[\d+\] (\S+): (.*)", out)
    assert all("CUDA" in why or "real GPU" in why for _, why in skipped), skipped
