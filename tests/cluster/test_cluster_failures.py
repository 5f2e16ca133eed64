"""Failures that cross simulated hosts: a host that refuses ssh or cannot be resolved, the
launcher SIGKILLed, a parameter server's host lost. Each time: a clear error naming the host,
fast, and nothing left running on any host (the ``cluster`` fixture checks every host after
each test). "Fast": the other workers were stopped, not left to run out their 120 s (fail_on.py
prints "waited to the end" when it does; the tests' own 120 s timeout bounds the rest)."""
from __future__ import annotations

import signal

import pytest
from helpers.cluster_jobs import PYTHON, accordrun, script, start_accordrun, wait_for_files

pytestmark = pytest.mark.timeout(120)


def test_host_refusing_ssh_stops_the_job_fast(cluster):
    cluster.stop_host("h2")  # down, cable in: connections are refused
    res = accordrun(cluster, "-H", "h1:1,h2:1", "--grace-period", "1", PYTHON, script("fail_on.py"), "9", "0")
    assert res.returncode == 255, res.stderr
    root = res.stderr[res.stderr.index("Root Cause"):]
    assert "rank       : 1 (local_rank 0, host h2)" in root, root
    assert "ssh: connect to host h2 port 22: Connection refused" in root, root
    assert "could not reach h2 through ssh" in root, root
    assert "waited to the end" not in res.stdout, res.stdout


def test_unreachable_host_stops_the_job_after_the_ssh_connect_timeout(cluster):
    cluster.stop_host("h2", unplug=True)  # packets to it vanish: ssh waits for its ConnectTimeout
    res = accordrun(cluster, "-H", "h1:1,h2:1", "--grace-period", "1", PYTHON, script("fail_on.py"), "9", "0")
    assert res.returncode == 255, res.stderr
    root = res.stderr[res.stderr.index("Root Cause"):]
    assert "host h2" in root and "timed out" in root and "could not reach h2 through ssh" in root, root
    assert "waited to the end" not in res.stdout, res.stdout  # stopped after ssh's 10 s ConnectTimeout


def test_unknown_host_name_stops_the_job_fast(cluster):
    res = accordrun(cluster, "-H", "h1:1,nosuchhost:1", "--grace-period", "1", PYTHON,
                    script("fail_on.py"), "9", "0")
    assert res.returncode == 255, res.stderr
    assert "host nosuchhost" in res.stderr and "Could not resolve hostname nosuchhost" in res.stderr, res.stderr


def test_launcher_killed_leaves_nothing_on_any_host(cluster, shared_dir):
    proc = start_accordrun(cluster, "-H", "h1:2,h2:2", "--grace-period", "1", PYTHON,
                           script("fail_on.py"), "99", "0", str(shared_dir))
    try:
        wait_for_files([shared_dir / f"ready.{r}" for r in range(4)], timeout=60, proc=proc)
        assert [n for n, _ in cluster.processes("h2")], "no worker runs on h2"
        proc.send_signal(signal.SIGKILL)  # nsenter exec'd accordrun: this is the launcher
        proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    left = cluster.wait_idle(timeout=20)
    assert not left, f"left running after the launcher was killed: {left}"


def test_parameter_server_host_lost(cluster, shared_dir):
    proc = start_accordrun(cluster, "-H", "h1:2", "--num-servers", "1", "--server-hosts", "h2",
                           "--grace-period", "1", PYTHON, script("kv_loop.py"), str(shared_dir))
    try:
        wait_for_files([shared_dir / f"ready.{r}" for r in range(2)], timeout=60, proc=proc)
        servers = [cmd for _, cmd in cluster.processes("h2") if "accord.kvstore.server" in cmd]
        assert servers, cluster.processes("h2")
        cluster.stop_host("h2")
        out, err = proc.communicate(timeout=60)  # the workers would loop for 120 s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0, err
    root = err[err.index("Root Cause"):]
    assert "server     : 0 (parameter server, host h2)" in root, root
