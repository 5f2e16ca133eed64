"""bootstrap() under a bare `mpirun` (no accord variables): rank 0 starts the store and sends
its address and a fresh secret to the others through MPI."""
from __future__ import annotations

import json

import pytest
from helpers.mpirun import mpi_ready, run_under_mpirun

pytestmark = pytest.mark.mpi

_SCRIPT = r'''
import json
import sys
import torch
from mpi4py import MPI
from accord.runtime.bootstrap import bootstrap
from accord.runtime.rendezvous import _same_host

torch.set_num_threads(1)
comm = MPI.COMM_WORLD
# One file per rank: mpirun interleaves the ranks' stdout, even in the middle of a line.
out = open(f"{sys.argv[1]}.{comm.Get_rank()}", "w")
# The host check rank 0 uses when the launcher does not say how many ranks share a host.
print(json.dumps({"same": _same_host(comm, MPI, "h"),
                  "differ": _same_host(comm, MPI, f"h{comm.Get_rank()}")}), file=out, flush=True)
for round_ in range(2):  # the second bootstrap checks shutdown-then-init under MPI
    rt = bootstrap(timeout=30)
    t = rt.topology
    # summed over the store the ranks met on
    rt.store.set(f"value/{t.rank}", f"{t.rank + 1} {round_}")
    rt.store.wait([f"value/{r}" for r in range(t.size)])
    rows = [[float(x) for x in rt.store.get(f"value/{r}").split()] for r in range(t.size)]
    value = torch.tensor(rows).sum(0)
    print(json.dumps({"round": round_, "rank": t.rank, "size": t.size, "source": rt.source,
                      "local_size": t.local_size, "sum": value.tolist(),
                      "secret": rt.secret.hex()}), file=out, flush=True)
    rt.close()
'''

@pytest.mark.timeout(120)
@pytest.mark.skipif(not mpi_ready(), reason="needs mpirun and mpi4py")
def test_mpirun_bootstrap_without_accord_variables(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(_SCRIPT)
    proc = run_under_mpirun(str(script), 2, str(tmp_path / "result"))
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    text = "".join((tmp_path / f"result.{rank}").read_text() for rank in (0, 1))
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    checks = [line for line in lines if "same" in line]
    lines = [line for line in lines if "same" not in line]
    assert checks == [{"same": True, "differ": False}] * 2, text
    assert len(lines) == 4, text
    for line in lines:
        assert line["source"] == "openmpi"
        assert line["size"] == 2 and line["local_size"] == 2
        assert line["sum"] == [3.0, 2.0 * line["round"]]
    assert sorted((line["round"], line["rank"]) for line in lines) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # Both ranks got rank 0's fresh secret through MPI, and each bootstrap made a new one.
    by_round = {r: {line["secret"] for line in lines if line["round"] == r} for r in (0, 1)}
    assert len(by_round[0]) == 1 and len(by_round[1]) == 1 and by_round[0] != by_round[1]


_UNINITIALIZED_SCRIPT = r'''
import json
import sys
import mpi4py
mpi4py.rc.initialize = False  # as Horovod's tests do: MPI is left to the framework
from mpi4py import MPI
import torch
import accord.torch as hvd

before = MPI.Is_initialized()
hvd.init()
out = open(f"{sys.argv[1]}.{hvd.rank()}", "w")
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
print(json.dumps({"before": before, "after": MPI.Is_initialized(), "rank": hvd.rank(),
                  "mpi_rank": MPI.COMM_WORLD.Get_rank(), "sum": total.tolist(),
                  "threads": hvd.mpi_threads_supported() if hvd.mpi_enabled() else None}),
      file=out, flush=True)
if sys.argv[2] == "shutdown":  # else atexit: accord stops first, then MPI is finalized
    hvd.shutdown()
'''


@pytest.mark.timeout(120)
@pytest.mark.skipif(not mpi_ready(), reason="needs mpirun and mpi4py")
@pytest.mark.parametrize("backend, ending", [("auto", "shutdown"), ("mpi", "shutdown"), ("mpi", "exit")])
def test_init_initializes_mpi_when_the_script_left_it_to_us(tmp_path, backend, ending):
    """mpi4py.rc.initialize = False: hvd.init() initializes MPI itself (as Horovod's core does),
    the job runs, and MPI is finalized at exit (mpirun reports no rank that skipped it), also
    when the script never calls shutdown (accord's engine must stop before MPI is finalized)."""
    script = tmp_path / "worker.py"
    script.write_text(_UNINITIALIZED_SCRIPT)
    proc = run_under_mpirun(str(script), 2, str(tmp_path / "result"), ending, ACCORD_CPU_BACKEND=backend)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "finalize" not in (proc.stdout + proc.stderr).lower(), proc.stdout + proc.stderr
    got = [json.loads((tmp_path / f"result.{rank}").read_text()) for rank in (0, 1)]
    for rank, line in enumerate(got):
        assert (line["before"], line["after"]) == (False, True), line
        assert line["rank"] == line["mpi_rank"] == rank and line["sum"] == [3.0]
    if backend == "mpi":
        assert all(line["threads"] is True for line in got), got  # THREAD_MULTIPLE was asked for


_SPLIT_SCRIPT = r'''
import json
import sys
from mpi4py import MPI
import torch
import accord.torch as hvd

comm = MPI.COMM_WORLD
subcomm = comm.Split(color=comm.rank % 2, key=comm.rank)  # Horovod's static process set example
ps = hvd.ProcessSet(subcomm)
hvd.init(comm=comm, process_sets=[ps])
total = hvd.allreduce(torch.tensor([comm.rank + 1.0]), op=hvd.Sum, process_set=ps)
with open(f"{sys.argv[1]}.{comm.rank}", "w") as out:
    print(json.dumps({"id": ps.process_set_id, "ranks": ps.ranks, "sum": total.tolist()}), file=out)
hvd.shutdown()
'''


@pytest.mark.timeout(120)
@pytest.mark.skipif(not mpi_ready(), reason="needs mpirun and mpi4py")
def test_process_sets_from_a_split_communicator(tmp_path):
    """Each rank passes only its own half of COMM_WORLD.Split: both sets exist on every rank,
    each rank's set gets its own id and reduces over its members only."""
    script = tmp_path / "worker.py"
    script.write_text(_SPLIT_SCRIPT)
    proc = run_under_mpirun(str(script), 2, str(tmp_path / "result"))
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    got = [json.loads((tmp_path / f"result.{rank}").read_text()) for rank in (0, 1)]
    assert got == [{"id": 1, "ranks": [0], "sum": [1.0]}, {"id": 2, "ranks": [1], "sum": [2.0]}], got
