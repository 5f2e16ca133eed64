"""examples/digits_fit.py, the README's main job: 2 ranks through accordrun and through spawn."""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("sklearn", reason="the digits example needs scikit-learn (dev extra)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATED_ACCURACY = 0.93  # the example's docstring: about 95% on the 359 test images
ACCURACY = re.compile(r"final test accuracy (\d\.\d+) \(top-2 (\d\.\d+), loss (\d+\.\d+)\) on 359 test images")


def _run(args, timeout=100):
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _accuracy(text):
    found = ACCURACY.findall(text)
    assert len(found) == 1, text
    return float(found[0][0])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_digits_fit_on_two_ranks_through_accordrun():
    out = _run([sys.executable, "-m", "accord.run", "-np", "2", sys.executable, "examples/digits_fit.py",
                "--log-freq", "100"])
    assert re.search(r"\[0\]<stdout>:digits_fit: world size 2 \(\d+ threads? per rank\), "
                     r"global batch 64 = 2 x 32 per rank, 15 epochs", out), out
    assert _accuracy(out) >= STATED_ACCURACY
    assert re.search(r"\[0\]<stdout>:digits_fit: throughput \d+ samples/s, \d+\.\d ms per epoch", out)
    assert "[0]<stdout>:Epoch 15/15" in out and "[0]<stdout>:Eval samples: 359" in out
    assert "[1]<stdout>:" not in out  # only rank 0 logs


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_digits_fit_through_spawn_matches_accordrun_settings(tmp_path):
    out = _run([sys.executable, "examples/digits_fit.py", "--spawn", "2", "--epochs", "3",
                "--verbose", "0", "--json", str(tmp_path / "summary.json")])
    assert "digits_fit: world size 2" in out
    import json

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["batch_per_rank"] == 32
    assert summary["test_samples"] == 359 and 0.0 < summary["test_accuracy"] <= 1.0
