"""Other ways of running across simulated hosts: accord's mpi backend under a bare Open MPI
mpirun (flat allreduce: the same digests as the hierarchical path of test_cluster_launch.py), and
--sync-dst-dir on three hosts."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cluster_expected import sum_digests, trained_weights
from helpers.cluster_jobs import PYTHON, accordrun, reports, script

pytestmark = pytest.mark.timeout(150)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
@pytest.mark.timeout(300)  # 40-120 s on the loaded 2-core machine: 4 ranks, MPI and torch start-up
def test_mpirun_across_hosts_with_the_mpi_backend(cluster, shared_dir):
    """Open MPI starts the remote ranks through ssh (its orted on h2); accord bootstraps from
    MPI's environment and allreduces on the mpi backend."""
    from simcluster import Cluster

    env = Cluster.env({"OMP_NUM_THREADS": "1"})
    res = cluster.run("h1", ["mpirun", "--allow-run-as-root", "-np", "4", "-H", "h1:2,h2:2",
                             "-x", "ACCORD_CPU_BACKEND=mpi", "-x", "OMP_NUM_THREADS",
                             "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
                             PYTHON, script("hvd_job.py"), "--report-dir", str(shared_dir)],
                      env=env, timeout=280)
    assert res.returncode == 0, res.stdout + res.stderr
    got = {r: json.loads((shared_dir / f"report.{r}.json").read_text()) for r in range(4)}
    f32, i64 = sum_digests(4)
    weights = trained_weights(4)
    assert [(got[r]["hostname"], got[r]["local_rank"], got[r]["cross_rank"]) for r in range(4)] == \
        [("h1", 0, 0), ("h1", 1, 0), ("h2", 0, 1), ("h2", 1, 1)]
    for r in range(4):
        assert got[r]["path"] == "MpiCommunicator", got[r]
        assert (got[r]["sum_f32"], got[r]["sum_i64"]) == (f32, i64)
        assert got[r]["weights"] == pytest.approx(weights, abs=1e-5)


def test_sync_dst_dir_copies_the_working_folder_to_every_host(make_cluster):
    """The launch folder is copied into each host's private /tmp, and every worker runs there."""
    cluster = make_cluster(hosts=3)
    project = Path(cluster.shared) / "project"
    (project / "data").mkdir(parents=True)
    shutil.copy(script("in_dir.py"), project)
    (project / "data" / "payload.txt").write_text("copied")
    res = accordrun(cluster, "-H", "h1:1,h2:1,h3:1", "--sync-dst-dir", "/tmp/job", PYTHON, "in_dir.py",
                    cwd=project)
    assert res.returncode == 0, res.stderr
    got = reports(res.stdout)
    assert [(got[r]["hostname"], got[r]["cwd"], got[r]["payload"]) for r in range(3)] == \
        [(f"h{r + 1}", "/tmp/job", "copied") for r in range(3)]
    for host in ("h2", "h3"):  # the copy is in that host's own /tmp, not in the shared folder
        listing = cluster.run(host, ["ls", "/tmp/job/data"])
        assert listing.stdout.split() == ["payload.txt"], listing
    assert cluster.run("h2", ["ls", "/tmp/job"]).returncode == 0
