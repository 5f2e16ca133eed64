"""accordrun across simulated hosts through real ssh: -H, --hostfile, --ips, placement values,
prefixes and per-rank files, --network-interface (nothing on 0.0.0.0), automatic hierarchical
allreduce chosen automatically, Horovod-style training, a DDP env:// script, parameter servers
spread over the hosts. (Flat and hierarchical give the same values: test_cluster_frameworks.py's
mpirun job, flat on the mpi backend, checks the same digests.)"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from cluster_expected import sum_digests, trained_weights
from helpers.cluster_jobs import PYTHON, accordrun, reports, script, start_accordrun, wait_for_files

pytestmark = pytest.mark.timeout(240)

PLACES = [("h1", 0, 0), ("h1", 1, 0), ("h2", 0, 1), ("h2", 1, 1)]  # host, local rank, cross rank


def _check_training_job(reports_, path: str) -> None:
    f32, i64 = sum_digests(4)
    weights = trained_weights(4)
    for r in range(4):
        rep = reports_[r]
        host, local, cross = PLACES[r]
        assert (rep["size"], rep["local_size"], rep["cross_size"]) == (4, 2, 2)
        assert (rep["hostname"], rep["env_hostname"] in (host, f"10.77.0.{host[1]}"),
                rep["local_rank"], rep["cross_rank"]) == (host, True, local, cross), rep
        assert (rep["sum_f32"], rep["sum_i64"]) == (f32, i64), f"rank {r}: wrong allreduce result"
        assert rep["path"] == path, rep
        assert rep["weights"] == pytest.approx(weights, abs=1e-5), f"rank {r}"
    assert len({tuple(reports_[r]["weights"]) for r in range(4)}) == 1  # bit-identical on every rank


def test_hosts_interface_servers_and_automatic_hierarchy(cluster, shared_dir):
    """-H h1:2,h2:2 --network-interface eth0 --num-servers 2: values, prefixes, files, sockets."""
    pause = shared_dir / "pause"
    pause.mkdir()
    logs = shared_dir / "logs"
    proc = start_accordrun(cluster, "-np", "4", "-H", "h1:2,h2:2", "--network-interface", "eth0",
                           "--num-servers", "2", "--output-filename", str(logs), PYTHON,
                           script("hvd_job.py"), "--pause", str(pause))
    try:
        wait_for_files([pause / f"ready.{r}" for r in range(4)], timeout=200, proc=proc)
        listeners = {h: cluster.listening(h) for h in ("h1", "h2")}
        (pause / "go").touch()
        out, err = proc.communicate(timeout=100)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    # nothing on a wildcard address; everything else on the host's own eth0 address or loopback
    for host, found in listeners.items():
        own = cluster.hosts[host].address
        wild = [str(lis) for lis in found if lis.address in ("0.0.0.0", "::")]
        assert not wild, f"{host}: listening on every interface: {wild}"
        stray = [str(lis) for lis in found if lis.address not in (own, "127.0.0.1", "::1")]
        assert not stray, f"{host}: listening on another address than {own}: {stray}"
        servers = [lis for lis in found if "accord.kvstore.server" in lis.command and lis.address == own]
        assert servers, f"{host}: no parameter server listens on {own}: {[str(lis) for lis in found]}"
        workers = [lis for lis in found if "hvd_job.py" in lis.command and lis.address == own]
        assert workers, f"{host}: no worker (Gloo) listens on {own}: {[str(lis) for lis in found]}"
    store = [lis for lis in listeners["h1"] if "accordrun" in lis.command]
    assert store and all(lis.address == "10.77.0.1" for lis in store), [str(lis) for lis in store]

    got = reports(out)
    assert sorted(got) == [0, 1, 2, 3], out + err
    _check_training_job(got, "HierarchicalCommunicator")  # chosen with no variable set
    assert all(got[r]["hierarchical_allreduces"] > 0 for r in range(4))
    for r in range(4):
        assert got[r]["kv_sync"] == [10.0, 10.0]
        assert got[r]["kv_async"] == pytest.approx([-0.5 * 2 * 10] * 20)
    for r in range(4):  # prefixes on the console, and per-rank files
        assert f"[{r}]<stdout>:REPORT " in out
        assert "REPORT " in (logs / f"rank.{r}" / "stdout").read_text()
    assert (logs / "server.0").is_dir() and (logs / "server.1").is_dir()


def test_ips_with_a_ddp_env_script(cluster):
    """--ips ... --nproc-per-node 2 running a plain torch DDP env:// script: placement, master
    address, and the same trained weights on every rank as computed here. The launch host's own
    address (10.77.0.1, run from h1) starts its ranks directly; only h2's go through ssh."""
    res = accordrun(cluster, "--ips", "10.77.0.1,10.77.0.2", "--nproc-per-node", "2", PYTHON,
                    script("ddp_train.py"))
    assert res.returncode == 0, res.stderr
    got = reports(res.stdout)
    assert [(got[r]["hostname"], got[r]["local_rank"], got[r]["group_rank"]) for r in range(4)] == \
        [("h1", 0, 0), ("h1", 1, 0), ("h2", 0, 1), ("h2", 1, 1)]
    assert {got[r]["master"] for r in range(4)} == {"10.77.0.1"}
    assert [got[r]["via_ssh"] for r in range(4)] == [False, False, True, True]
    expected = trained_weights(4)
    for r in range(4):
        assert got[r]["weights"] == pytest.approx(expected, abs=1e-5), f"rank {r}"


def test_ddp_on_the_accord_backend_across_hosts(cluster):
    """The same DDP script on init_process_group("accord") across 2 hosts x 2 ranks: the weights
    of a one-host computation, and accord's engine allreduces host-first (shared memory within a
    host, Gloo across) for the large tensors where that is faster."""
    res = accordrun(cluster, "-H", "h1:2,h2:2", PYTHON, script("ddp_train.py"), "accord")
    assert res.returncode == 0, res.stderr
    got = reports(res.stdout)
    expected = trained_weights(4)
    for r in range(4):
        assert got[r]["weights"] == pytest.approx(expected, abs=1e-5), f"rank {r}"
        assert got[r]["big_ok"], f"rank {r}: a large all_reduce came back wrong"
        assert got[r]["path"] == "HierarchicalCommunicator", got[r]
    assert all(got[r]["hierarchical_allreduces"] > 0 for r in range(4)), got


def test_a_bare_python_from_an_activated_venv_runs_the_venv_on_every_host(cluster):
    """`accordrun -H h1:1,h2:1 python ...` with the venv activated (PATH and VIRTUAL_ENV, as
    `source .venv/bin/activate` sets them): the remote rank runs the venv's python too, found
    through the forwarded PATH, as horovodrun users expect (the hosts share the file system)."""
    venv = str(Path(PYTHON).parent.parent)
    path = f"{Path(PYTHON).parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
    res = accordrun(cluster, "-H", "h1:1,h2:1", "python", "-c",
                    "import socket, sys, torch; print('where', socket.gethostname(), sys.prefix)",
                    PATH=path, VIRTUAL_ENV=venv)
    assert res.returncode == 0, res.stderr
    where = sorted(line.split()[-2:] for line in res.stdout.splitlines() if "where " in line)
    assert where == [["h1", venv], ["h2", venv]], res.stdout


def test_hostfile_and_a_worker_dying_on_the_second_host(cluster, shared_dir):
    """--hostfile; rank 3 on h2 exits 7: the job stops fast with that status, the root cause
    names h2 and rank 3, h1's workers are stopped and nothing is left on either host."""
    hostfile = shared_dir / "hosts"
    hostfile.write_text("# two simulated hosts\nh1 slots=2\nh2 slots=2\n")
    res = accordrun(cluster, "--hostfile", str(hostfile), "--grace-period", "2", PYTHON,
                    script("fail_on.py"), "3", "7")
    assert res.returncode == 7, res.stderr
    assert [reports(res.stdout)[r]["hostname"] for r in range(4)] == ["h1", "h1", "h2", "h2"]
    root = res.stderr[res.stderr.index("Root Cause"):]
    assert "rank       : 3 (local_rank 1, host h2)" in root, root
    assert "rank 3 on h2 fails now" in res.stderr
    assert "waited to the end" not in res.stdout, res.stdout  # the others were stopped
