"""A plain torch.distributed DDP script (init_process_group with env://) runs unchanged."""
import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "launcher_testlib", Path(__file__).parent / "scripts" / "launcher_testlib.py")
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_plain_ddp_env_script_runs_unchanged():
    proc = lib.accordrun("-np", "2", lib.PYTHON, lib.script("ddp_allreduce.py"), timeout=50)
    assert proc.returncode == 0, proc.stderr
    results = {}
    for line in proc.stdout.splitlines():
        if "RESULT " in line:
            data = json.loads(line.split("RESULT ", 1)[1])
            assert line.startswith(f"[{data['rank']}]<stdout>:")
            results[data["rank"]] = data
    assert sorted(results) == [0, 1]
    world = 2
    expected_sum = sum(r + 1 for r in range(world))  # allreduce of rank+1
    expected_grad = [sum(r + 1 for r in range(world)) / world] * 2  # DDP averages x = rank+1
    for rank, data in results.items():
        assert data["world"] == world and data["local_rank"] == rank
        assert data["sum"] == expected_sum
        assert data["grad"] == pytest.approx(expected_grad)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_accord_init_through_the_launchers_store():
    pytest.importorskip("accord.runtime.bootstrap")
    proc = lib.accordrun("-np", "2", lib.PYTHON, lib.script("accord_init.py"), timeout=50)
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in proc.stdout.splitlines() if "RESULT " in line]
    assert sorted((r["rank"], r["local_rank"], r["size"], r["sum"], r["source"]) for r in results) == [
        (0, 0, 2, 3.0, "accord"), (1, 1, 2, 3.0, "accord")]
