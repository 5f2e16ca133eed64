"""The accord.torch examples through the real launcher on 2 ranks, checked on what they print."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _accordrun(*argv: str, timeout: float) -> str:
    proc = subprocess.run([sys.executable, "-m", "accord.run", "-np", "2", sys.executable, *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.timeout(120)
def test_synthetic_benchmark_prints_horovods_lines():
    out = _accordrun("examples/pytorch_synthetic_benchmark.py", "--model", "resnet18",
                     "--image-size", "32", "--batch-size", "4", "--num-warmup-batches", "1",
                     "--num-batches-per-iter", "1", "--num-iters", "2", "--bf16-allreduce",
                     "--no-cuda", timeout=110)
    lines = [line.split(":", 1)[1] for line in out.splitlines() if line.startswith("[0]<stdout>:")]
    assert lines[:5] == ["Model: resnet18", "Batch size: 4", "Number of CPUs: 2",
                         "Running warmup...", "Running benchmark..."]
    rates = [float(re.fullmatch(r"Iter #(\d): (\d+\.\d) img/sec per CPU", line).group(2))
             for line in lines[5:7]]
    assert [line.split(":")[0] for line in lines[5:7]] == ["Iter #0", "Iter #1"]
    mean = re.fullmatch(r"Img/sec per CPU: (\d+\.\d) \+-(\d+\.\d)", lines[7])
    total = re.fullmatch(r"Total img/sec on 2 CPU\(s\): (\d+\.\d) \+-(\d+\.\d)", lines[8])
    assert mean and total and len(lines) == 9
    assert float(mean.group(1)) == pytest.approx(sum(rates) / 2, abs=0.1)
    assert float(total.group(1)) == pytest.approx(2 * float(mean.group(1)), abs=0.2)
    assert "[1]<stdout>:" not in out  # only rank 0 reports, as in Horovod


@pytest.mark.timeout(120)
def test_digits_example_reaches_its_stated_accuracy():
    out = _accordrun("examples/pytorch_digits.py", timeout=110)
    final = re.search(r"\[0\]<stdout>:Final test accuracy (\d\.\d+) on 2 ranks: reached the target 0\.95",
                      out)
    assert final, out
    assert float(final.group(1)) >= 0.95
    assert re.search(r"\[0\]<stdout>:Test set: Average loss: \d+\.\d+, Accuracy: \d+\.\d+%", out)
    # the example reports its training time; how long it is belongs to benchmarks, not here
    assert float(re.search(r"Training time: (\d+\.\d) s", out).group(1)) > 0
