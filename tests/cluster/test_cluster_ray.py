"""accord.ray across two simulated hosts: a Ray head on h1 and a Ray worker node on h2 (Ray's
ports exist only in the hosts' network namespaces), and a RayExecutor driver on h1 whose two
workers, one per node, meet over the driver's store on h1's address and allreduce across hosts.
Skipped without Ray."""
from __future__ import annotations

import json
import os
import secrets
import signal
import time

import pytest
from helpers.cluster_jobs import PYTHON, script

pytest.importorskip("ray", reason="Ray is not installed: pip install 'accord[ray]' "
                                  "(scripts/setup_env.sh installs it in .venv)")

RAY = [PYTHON, "-m", "ray.scripts.scripts"]
HEAD = "10.77.0.1"


@pytest.mark.timeout(420)
def test_ray_executor_across_two_hosts(cluster):
    from simcluster import Cluster

    # Ray's token authentication with a token of this test's own, in the environment: no token
    # file is written in the home folder the hosts share
    env = Cluster.env({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "OMP_NUM_THREADS": "1",
                       "RAY_USAGE_STATS_ENABLED": "0"})
    common = ["--num-cpus=1", "--object-store-memory=200000000", "--disable-usage-stats"]
    try:
        head = cluster.run("h1", RAY + ["start", "--head", f"--node-ip-address={HEAD}", "--port=6379",
                                        "--include-dashboard=false", *common], env=env, timeout=180)
        assert head.returncode == 0, head.stdout + head.stderr
        node = cluster.run("h2", RAY + ["start", f"--address={HEAD}:6379", "--node-ip-address=10.77.0.2",
                                        *common], env=env, timeout=180)
        assert node.returncode == 0, node.stdout + node.stderr
        res = cluster.run("h1", [PYTHON, script("ray_driver.py"), f"{HEAD}:6379"], env=env, timeout=240)
        assert res.returncode == 0, res.stdout + res.stderr
        line = next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULTS "))
        results = json.loads(line[len("RESULTS "):])
    finally:
        _stop_ray(cluster)
    assert [r["rank"] for r in results] == [0, 1] and {r["size"] for r in results} == {2}
    assert sorted(r["hostname"] for r in results) == ["h1", "h2"]  # one worker per node
    assert [(r["local_rank"], r["cross_rank"], r["cross_size"]) for r in results] == [(0, 0, 2), (0, 1, 2)]
    assert [r["sum"] for r in results] == [3.0, 3.0]  # 1 + 2, across the hosts
    assert {r["store"] for r in results} == {HEAD}  # the driver's store, on h1's address


def _stop_ray(cluster, timeout=60.0):
    """End every process Ray started on the hosts (all but their sshd), with SIGKILL as ``ray stop
    --force``, but only these: the hosts share the machine's processes, and ``ray stop`` kills
    every Ray process it finds there, other clusters' too. What is left after ``timeout`` fails
    the test (the ``cluster`` fixture's check)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = [pid for host in cluster.hosts for pid, _ in cluster.processes(host)]
        if not running:
            return
        for pid in running:  # again on the next round: a raylet may start a worker meanwhile
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
