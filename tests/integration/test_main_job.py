"""The collectives demo on 2 ranks through the real accordrun CLI (the README's main job,
examples/digits_fit.py, has its own test: test_digits_example.py)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(90)
def test_collectives_demo_on_two_ranks():
    proc = subprocess.run(
        [sys.executable, "-m", "accord.run", "-np", "2", sys.executable, "examples/collectives_demo.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=80,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        assert f"[{rank}]<stdout>:rank {rank}/2: all results correct" in proc.stdout
        assert f"[{rank}]<stdout>:rank {rank}/2 host localhost: allreduce sum [3.0, 6.0, 9.0, 12.0]" in proc.stdout
    assert "allgather (ragged) column 0 [0.0, 1.0, 1.0]" in proc.stdout
