"""The MPI Operator's ssh settings on simulated hosts shaped like an MPIJob (StatefulSet host names,
sshd on port 2222, the launcher outside the hostfile): OMPI_MCA_plm_rsh_args carries the port to
ssh and to --sync-dst-dir's rsync, and --sync-dst-dir copies through a stand-in for kubexec.sh
(an rsh agent that enters the hosts' namespaces without ssh and runs its arguments as one command,
as kubexec.sh's ``sh -c "$*"`` does)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.cluster_jobs import ACCORDRUN, PYTHON, job_env, reports, script

pytestmark = pytest.mark.timeout(150)

WORKERS = ["job-worker-0.job-worker", "job-worker-1.job-worker"]


def _mpijob(make_cluster):
    cluster = make_cluster(names=["job-launcher", *WORKERS], ssh_port=2222)
    folder = Path(cluster.shared) / "mpijob"
    (folder / "project" / "data").mkdir(parents=True)
    shutil.copy(script("in_dir.py"), folder / "project")
    (folder / "project" / "data" / "payload.txt").write_text("copied")
    hostfile = folder / "hostfile"
    hostfile.write_text("".join(f"{w} slots=1\n" for w in WORKERS))
    return cluster, folder, hostfile


def _run_synced(cluster, folder: Path, **env: str):
    return cluster.run("job-launcher", [ACCORDRUN, "-np", "2", "--sync-dst-dir", "/tmp/job", PYTHON, "in_dir.py"],
                       timeout=120, cwd=str(folder / "project"), env=job_env(**env))


def _check_copied(cluster, res) -> None:
    assert res.returncode == 0, res.stderr
    got = reports(res.stdout)
    assert [(got[r]["hostname"], got[r]["cwd"], got[r]["payload"]) for r in range(2)] == \
        [(w, "/tmp/job", "copied") for w in WORKERS]
    for worker in WORKERS:  # the copy is in each worker's own /tmp
        assert cluster.run(worker, ["cat", "/tmp/job/data/payload.txt"]).stdout == "copied"
    assert cluster.run("job-launcher", ["ls", "/tmp/job"]).returncode != 0  # the launcher runs no worker


def test_plm_rsh_args_give_ssh_and_rsync_the_port(make_cluster):
    cluster, folder, hostfile = _mpijob(make_cluster)
    env = {"OMPI_MCA_orte_default_hostfile": str(hostfile)}
    # without the port, ssh goes to port 22, where nothing listens: the copy fails, naming the hosts
    res = _run_synced(cluster, folder, **env)
    assert res.returncode != 0 and "--sync-dst-dir: could not copy" in res.stderr and WORKERS[0] in res.stderr
    res = _run_synced(cluster, folder, OMPI_MCA_plm_rsh_args="-o ConnectionAttempts=3 -p 2222", **env)
    _check_copied(cluster, res)


def test_sync_dst_dir_copies_through_the_rsh_agent(make_cluster):
    cluster, folder, hostfile = _mpijob(make_cluster)
    # no port anywhere: ssh to port 22 would be refused, so only the agent can copy and start
    res = _run_synced(cluster, folder, OMPI_MCA_orte_default_hostfile=str(hostfile),
                      OMPI_MCA_plm_rsh_agent=cluster.write_rsh_agent(str(folder / "kubexec.sh"), WORKERS))
    _check_copied(cluster, res)
