"""The engine with ACCORD_CPU_BACKEND=mpi under a real mpirun (2 ranks): Horovod's API end to end
on mpi4py communicators, scale factors and integer Average included, and an idle engine that sleeps."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.idle_engine import check_idle
from helpers.mpirun import mpi_ready, run_under_mpirun

pytestmark = pytest.mark.mpi

_SCRIPT = r'''
import json, sys, time
import torch
import accord.torch as hvd

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
from accord.engine import session
out = {"backend": session.backend_name("cpu"), "rank": r}
x = torch.arange(6, dtype=torch.float32) + 10 * r
out["avg_scaled"] = hvd.allreduce(x, op=hvd.Average, prescale_factor=2.0, postscale_factor=0.5).tolist()
out["int_avg"] = hvd.allreduce(torch.tensor([3 + 2 * r, -7 - r]), op=hvd.Average).tolist()
out["max"] = hvd.allreduce(torch.tensor([float(r), -float(r)]), op=hvd.Max).tolist()
out["ragged"] = hvd.allgather(torch.full((r + 1, 2), float(r))).tolist()
out["bcast"] = hvd.broadcast(torch.full((3,), float(r + 5)), root_rank=1).tolist()
grads = [torch.full((4,), float(r + i)) for i in range(3)]
out["grouped"] = [g.tolist() for g in hvd.grouped_allreduce(grads, op=hvd.Sum)]
out["rs"] = hvd.reducescatter(torch.arange(4, dtype=torch.float64) * (r + 1), op=hvd.Sum,
                              prescale_factor=3.0).tolist()
# idle: every controller parked on its condition, cycling only on its tick (tests/helpers/idle_engine.py)
sys.path.insert(0, sys.argv[2])
from helpers.idle_engine import watch_idle
hvd.barrier()
out["idle"] = watch_idle(session.engine(), seconds=3.0)
hvd.shutdown()
with open(f"{sys.argv[1]}.{r}", "w") as fh:
    fh.write(json.dumps(out))
'''

@pytest.mark.timeout(120)
@pytest.mark.skipif(not mpi_ready(), reason="needs mpirun and mpi4py")
def test_engine_on_the_mpi_backend(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(_SCRIPT)
    tests = str(Path(__file__).resolve().parents[1])
    proc = run_under_mpirun(str(script), 2, str(tmp_path / "result"), tests, ACCORD_CPU_BACKEND="mpi")
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    res = [json.loads((tmp_path / f"result.{rank}").read_text()) for rank in (0, 1)]
    xs = [[float(i + 10 * r) for i in range(6)] for r in (0, 1)]
    for rank, out in enumerate(res):
        assert out["backend"] == "mpi" and out["rank"] == rank
        assert out["avg_scaled"] == [(a + b) / 2 for a, b in zip(*xs)]  # 2.0 * 0.5 cancels
        # integer Average truncates toward zero (Horovod scales by 1/size and casts back)
        assert out["int_avg"] == [4, -7]
        assert out["max"] == [1.0, 0.0]
        assert out["ragged"] == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
        assert out["bcast"] == [6.0, 6.0, 6.0]
        assert out["grouped"] == [[float(2 * i + 1)] * 4 for i in range(3)]
        total = [3.0 * (i * 1 + i * 2) for i in range(4)]  # prescale 3, summed over ranks
        assert out["rs"] == total[2 * rank:2 * rank + 2]
        check_idle(out["idle"], set_ids=[0])


@pytest.mark.timeout(120)
@pytest.mark.skipif(not mpi_ready(), reason="needs mpirun and mpi4py")
def test_engine_precision_on_the_mpi_backend():
    """Every collective x dtype bit-exact (copies) or within the derived bound (reductions),
    compression included, on 2 ranks (see tests/helpers/precision_checks.py; the communicator
    checks run the mpi backend on 3 ranks too, in test_comm_mpi.py)."""
    import os
    import re

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_comm_checks.py")
    proc = run_under_mpirun(script, 2, "--engine", ACCORD_CPU_BACKEND="mpi")
    out = proc.stdout + proc.stderr
    summaries = re.findall(r"rank (\d+) on (\w+): (\d+) checks, (\d+) failures", out)
    assert proc.returncode == 0, out[-6000:]
    assert sorted(int(r) for r, _, _, _ in summaries) == [0, 1], out[-3000:]
    assert all(b == "mpi" and int(n) > 200 and f == "0" for _, b, n, f in summaries), out[-3000:]
