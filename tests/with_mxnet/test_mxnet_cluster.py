"""MXNet's own dist_sync job across two simulated hosts (tools/simcluster): accord-mxnet-launch
with MXNet's ssh-launcher flags, started inside h1 over real ssh, puts 2 workers and 1 server on
each host and the scheduler on h1; the weights equal accord's KVStore plug-in on the same 4 workers
(as tests/with_mxnet/test_mxnet_launch.py computes them), and each server ran on its own host and
advertised that host's address to ps-lite."""
from __future__ import annotations

import re
import sys

import numpy as np
import pytest
from helpers.cluster_jobs import ACCORDRUN, job_env
from helpers.mxnet_env import require_mxnet

require_mxnet()

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]  # 7 MXNet processes twice, 2 cores

from test_mxnet_launch import EXAMPLE, _run  # noqa: E402

PARAMS = ["fc1_bias", "fc1_weight", "fc2_bias", "fc2_weight"]
# Each process says where it runs and in which role before MXNet starts (a server or the
# scheduler then serves inside `import mxnet` and never returns to the script).
WRAPPER = """
import os, runpy, socket, sys
print("NODE", os.environ["DMLC_ROLE"], socket.gethostname(), flush=True)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_mxnet_dist_sync_across_hosts_equals_accord_kvstore(cluster, shared_dir, tmp_path):
    wrapper = shared_dir / "where.py"
    wrapper.write_text(WRAPPER)
    hosts = shared_dir / "hosts"
    hosts.write_text("h1:2\nh2:2\n")
    launch = str(ACCORDRUN).replace("accordrun", "accord-mxnet-launch")
    res = cluster.run("h1", [launch, "-n", "4", "-s", "2", "-H", str(hosts), "--launcher", "ssh",
                             "--env", "PS_VERBOSE:1", sys.executable, str(wrapper), EXAMPLE, "--epochs", "1",
                             "--kv-store", "dist_sync", "--save-params", "mx.npz"],
                      cwd=str(shared_dir), env=job_env(), timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-5000:]
    assert "kvstore dist_sync (dist_sync), 4 worker(s), global batch 128" in res.stdout, out[-3000:]
    where = dict(re.findall(r"\[(\w+)\]<stdout>:NODE \w+ (\w+)", res.stdout))
    assert {k: v for k, v in where.items() if not k.isdigit()} == \
        {"scheduler": "h1", "server0": "h1", "server1": "h2"}, where
    assert sorted(v for k, v in where.items() if k.isdigit()) == ["h1", "h1", "h2", "h2"], where
    # ps-lite's scheduler (PS_VERBOSE=1) logs the address each server registered with: each host's own
    addresses = set(re.findall(r"role=server\b[^\n]*?\bip=([\d.]+)", out))
    assert addresses == {cluster.hosts["h1"].address, cluster.hosts["h2"].address}, out[-3000:]

    ours = _run([sys.executable, "-m", "accord.run", "-np", "4", sys.executable, EXAMPLE, "--epochs", "1",
                 "--kv-store", "accord", "--save-params", "accord.npz"], tmp_path, timeout=200)
    assert ours.returncode == 0, ours.stdout[-2000:] + ours.stderr[-3000:]
    assert "kvstore accord (dist_sync_accord), 4 worker(s)" in ours.stdout
    mx_params, accord_params = np.load(shared_dir / "mx.npz"), np.load(tmp_path / "accord.npz")
    assert sorted(mx_params) == sorted(accord_params) == PARAMS
    for name in PARAMS:
        np.testing.assert_allclose(accord_params[name], mx_params[name], rtol=1e-5, atol=1e-6)
