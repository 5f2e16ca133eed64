"""SLURM for real on simulated hosts: Debian's slurmctld and one slurmd per host (munge for their
authentication), started once for the module (tools/simcluster/slurm.py). ``srun`` starts
accord.torch workers that read SLURM's variables (no accordrun), and one accordrun agent per node.
Every test ends with no job step left and nothing but the daemons on the hosts; the fixture's
teardown checks that the daemons and their files are gone."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from pathlib import Path

import pytest
from helpers.cluster_jobs import ACCORDRUN, PYTHON, REPO, reports, script
from simcluster import Cluster, leftovers, missing_prerequisites
from simcluster.slurm import Slurm, missing_slurm

pytestmark = pytest.mark.timeout(180)

JOB = script("slurm_job.py")
DAEMONS = ("munged", "slurmctld", "slurmd")


@pytest.fixture(scope="module")
def slurm():
    """2 hosts (h1: munged, slurmctld and a slurmd; h2: a slurmd), for the whole module."""
    reason = missing_prerequisites() or missing_slurm()
    if reason is not None:
        pytest.skip(f"SLURM on the simulated cluster not available: {reason}")
    cluster = Cluster(hosts=2).start()
    try:
        with Slurm(cluster) as daemons:
            yield daemons
            daemons.close()
            left = cluster.wait_idle(timeout=10)
            assert not left, f"SLURM's daemons outlived Slurm.close(): {left}"
            assert not os.path.exists(daemons.folder)
    finally:
        cluster.close()
    assert not any(cluster.tag in name for names in leftovers().values() for name in names)


@pytest.fixture
def slurm_job(slurm, request):
    """The module's SLURM, with a fresh shared folder; after the test no step runs and nothing
    but the daemons is left on any host."""
    folder = Path(slurm.cluster.shared) / request.node.name
    folder.mkdir(mode=0o777)
    yield slurm, folder
    deadline = time.monotonic() + 15
    while True:
        steps = slurm.cluster.run("h1", ["squeue", "-h", "-o", "%i %T"], env=slurm.env(), timeout=10).stdout.split()
        extra = {host: [p for p in slurm.cluster.processes(host) if not _daemon(p[1])] for host in slurm.cluster.hosts}
        if not steps and not any(extra.values()):
            break
        if time.monotonic() > deadline:
            pytest.fail(f"left behind: jobs {steps}, processes {extra}")
        time.sleep(0.2)


def _daemon(cmdline: str) -> bool:
    first = cmdline.split(" ", 1)[0]
    return os.path.basename(first) in DAEMONS or cmdline.startswith("slurmctld:")


def _srun(slurm: Slurm, folder: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    res = slurm.cluster.run("h1", ["srun", "--kill-on-bad-exit=1", *argv], timeout=150, cwd=str(REPO),
                            env=slurm.env({"OMP_NUM_THREADS": "1", **env}))
    if res.returncode != 0:
        res.stderr += "\n" + slurm.logs()
    return res


def _check_world(got: dict[int, dict], agent: bool) -> None:
    """Ranks 0-3 on h1, h1, h2, h2 with what exactly-representable collectives must give."""
    assert sorted(got) == [0, 1, 2, 3]
    size = 4
    expected_sum = [float(i * sum(r + 1 for r in range(size))) for i in range(8)]
    for rank, rep in got.items():
        assert (rep["size"], rep["local_size"], rep["cross_size"]) == (4, 2, 2), rep
        assert (rep["hostname"], rep["local_rank"], rep["cross_rank"]) == (f"h{rank // 2 + 1}", rank % 2, rank // 2)
        assert rep["sum"] == expected_sum
        assert rep["gathered"] == [[r, r % 2] for r in range(size)]
        assert rep["bcast"] == [float((size - 1) * 10 + 7)]
        slurm_vars = rep["slurm"]
        if agent:  # one task per node: SLURM's task is the agent, accordrun gave the ranks
            assert rep["accord_rank"] == str(rank)
            assert (slurm_vars["SLURM_PROCID"], slurm_vars["SLURM_NTASKS"]) == (str(rank // 2), "2")
        else:  # srun's tasks are the ranks: nothing but SLURM's variables told them who they are
            assert rep["accord_rank"] is None
            assert (slurm_vars["SLURM_PROCID"], slurm_vars["SLURM_NTASKS"]) == (str(rank), "4")
            assert slurm_vars["SLURM_LOCALID"] == str(rank % 2)


def test_srun_two_tasks_per_node_run_hvd_init_from_slurms_variables(slurm_job):
    slurm, folder = slurm_job
    res = _srun(slurm, folder, "-N2", "--ntasks-per-node", "2", PYTHON, JOB, "--report-dir", str(folder),
                ACCORD_JOB_SECRET=secrets.token_hex(32))  # srun passes the environment to every task
    assert res.returncode == 0, res.stdout + res.stderr
    _check_world({r: json.loads((folder / f"report.{r}.json").read_text()) for r in range(4)}, agent=False)


def test_srun_one_agent_per_node_gives_four_ranks(slurm_job):
    slurm, folder = slurm_job
    secret = folder / "secret"
    secret.write_text(secrets.token_hex(32) + "\n")
    secret.chmod(0o600)
    # no --nnodes, --node-rank nor --rdzv-endpoint: SLURM_NNODES, SLURM_NODEID and the first host of
    # SLURM_JOB_NODELIST give them
    res = _srun(slurm, folder, "-N2", "--ntasks-per-node", "1", ACCORDRUN, "--nproc-per-node", "2",
                "--secret-file", str(secret), PYTHON, JOB)
    assert res.returncode == 0, res.stdout + res.stderr
    got = reports(res.stdout)
    _check_world(got, agent=True)
    for line in res.stdout.splitlines():  # each agent prefixes its workers' output
        if "REPORT {" in line:
            assert line.startswith(f"[{json.loads(line.split('REPORT ', 1)[1])['rank']}]<stdout>:")
