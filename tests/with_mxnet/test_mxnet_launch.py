"""MXNet's own parameter-server jobs started by accord (real processes): the launch.py-compatible
entry point runs a Module.fit script on MXNet's scheduler, server and workers (dist_sync), and
the same script on accord's KVStore plug-in ends with the same weights; a failing worker stops
MXNet's job fast and leaves no process behind."""
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest
from helpers.mxnet_env import require_mxnet

require_mxnet()

pytestmark = pytest.mark.timeout(200)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "mxnet_module_fit.py")
GLUON_EXAMPLE = os.path.join(ROOT, "examples", "mxnet_gluon_digits.py")


def _run(argv, cwd, timeout=150):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_mxnet_dist_sync_job_equals_accord_kvstore(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\n")
    fit = [sys.executable, EXAMPLE, "--epochs", "1"]
    # MXNet's tools/launch.py flags, ssh launcher on this host: scheduler + 1 server + 2 workers
    theirs = _run([sys.executable, "-m", "accord.run.mxnet_launch", "-n", "2", "-s", "1", "-H", str(hosts),
                   "--launcher", "ssh"] + fit + ["--kv-store", "dist_sync", "--save-params", "mx.npz"], tmp_path)
    assert theirs.returncode == 0, theirs.stdout[-2000:] + theirs.stderr[-3000:]
    # (ps-lite numbers the workers itself: its worker 0 may be accordrun's rank 1)
    assert "]<stdout>:mxnet_module_fit: kvstore dist_sync (dist_sync), 2 worker(s), global batch 64" \
        in theirs.stdout
    ours = _run([sys.executable, "-m", "accord.run", "-np", "2"] + fit
                + ["--kv-store", "accord", "--save-params", "accord.npz"], tmp_path)
    assert ours.returncode == 0, ours.stdout[-2000:] + ours.stderr[-3000:]
    assert "kvstore accord (dist_sync_accord), 2 worker(s)" in ours.stdout
    mx_params, accord_params = np.load(tmp_path / "mx.npz"), np.load(tmp_path / "accord.npz")
    assert sorted(mx_params) == sorted(accord_params) == ["fc1_bias", "fc1_weight", "fc2_bias", "fc2_weight"]
    for name in mx_params:
        np.testing.assert_allclose(accord_params[name], mx_params[name], rtol=1e-5, atol=1e-6)


FAILING = """
import os, sys, time
import mxnet as mx
kv = mx.kv.create("dist_sync")
kv.init(0, mx.nd.ones(4))
if os.environ["ACCORD_RANK"] == "1":
    os._exit(3)  # a crash (sys.exit would block in ps-lite's finalize, waiting for the others)
kv.push(0, mx.nd.ones(4))  # waits for the other worker's push, which never comes
kv.pull(0, out=mx.nd.zeros(4))
time.sleep(600)
"""


def test_failing_worker_stops_mxnet_job_and_cleans_up(tmp_path):
    marker = f"accord-mx-test-{uuid.uuid4().hex[:8]}"
    script = tmp_path / f"{marker}.py"
    script.write_text(FAILING)
    result = _run([sys.executable, "-m", "accord.run", "-np", "2", "--ps", "mxnet", "--num-servers", "1",
                   "--grace-period", "2", sys.executable, str(script)], tmp_path)  # 150 s: rank 0 would sleep 600
    assert result.returncode == 3, result.stderr[-3000:]
    assert "Root Cause (first observed failure)" in result.stderr
    assert "rank       : 1" in result.stderr
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert left == [], f"processes left behind: {left}"


def test_gluon_digits_example_same_accuracy_on_one_and_two_ranks(tmp_path):
    one = _run([sys.executable, GLUON_EXAMPLE, "--epochs", "3"], tmp_path)
    two = _run([sys.executable, "-m", "accord.run", "-np", "2", sys.executable, GLUON_EXAMPLE,
                "--epochs", "3"], tmp_path)
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-2000:] + two.stderr[-2000:]
    acc = [float(out.split("test accuracy ")[1].split(",")[0]) for out in (one.stdout, two.stdout)]
    assert "2 rank(s), global batch 64" in two.stdout
    assert acc[0] == acc[1] and acc[0] > 0.5, acc
