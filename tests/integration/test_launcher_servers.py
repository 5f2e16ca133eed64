"""`accordrun --num-servers` through the real CLI: workers plus parameter servers, MXNet's
environment, `[serverN]` output, a dying server, the guardian, and bad flag values.

The worker scripts are written to a temporary folder by the tests themselves. Expected values
are computed here with plain Python / numpy, from the formulas of the kvstore's semantics.
"""
import importlib.util
import json
import os
import signal
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location(
    "launcher_testlib", Path(__file__).parent / "scripts" / "launcher_testlib.py")
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

WORKERS, SERVERS, ROUNDS, ASYNC_PUSHES, LR = 2, 2, 3, 4, 0.5

# An MXNet-style script: reads DMLC_* itself, then dist_sync push/pull (no optimizer: the stored
# value is the round's sum over workers) and dist_async with SGD on the servers.
KV_JOB = f"""
import json, os
import numpy as np
import accord.kvstore as kvs
from accord.kvstore import optimizers

env = {{k: os.environ.get(k) for k in ("DMLC_ROLE", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER",
                                      "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "ACCORD_STORE_ADDR",
                                      "ACCORD_STORE_PORT")}}
kv = kvs.create("dist_sync")
out = {{"env": env, "rank": kv.rank, "num_workers": kv.num_workers, "num_servers": kv.num_servers}}
kv.init("big", np.zeros(40, np.float32))   # >= the bound of 16 below: split over both servers
kv.init("small", np.zeros(3, np.float32))
out["sync"] = []
for r in range(1, {ROUNDS} + 1):
    kv.push("big", np.full(40, (kv.rank + 1) * r, np.float32))
    kv.push("small", [np.full(3, r, np.float32), np.full(3, kv.rank, np.float32)])  # two "devices"
    out["sync"].append([kv.pull("big").tolist(), kv.pull("small").tolist()])
kv.close()
kv = kvs.create("dist_async")
kv.init("w", np.zeros(20, np.float32))
kv.set_optimizer(optimizers.create("sgd", learning_rate={LR}))
out["async"] = []
for _ in range({ASYNC_PUSHES}):
    kv.push("w", np.full(20, kv.rank + 1.0, np.float32))
    out["async"].append(kv.pull("w").tolist())
kv.barrier()
out["final"] = kv.pull("w").tolist()
kv.close()
print("RESULT " + json.dumps(out))
"""

# Pushes and pulls until a server goes away (the worker then fails, as it should).
KV_LOOP = """
import os, sys, time
import numpy as np
import accord.kvstore as kvs

pid_dir = sys.argv[1]
kv = kvs.create("dist_sync")
kv.init("big", np.zeros(40, np.float32))
for i in range(100000):
    kv.push("big", np.ones(40, np.float32))
    kv.pull("big")
    if i == 0:  # written whole, then renamed (the test reads the file once it exists)
        path = os.path.join(pid_dir, f"{kv.rank}.pids")
        with open(path + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
    time.sleep(0.02)
"""

# No kvstore at all: writes its pid and sleeps (for the guardian test; starts without torch).
SLEEPER = """
import os, sys, time
# written whole, then renamed: the test reads the file as soon as it exists
path = os.path.join(sys.argv[1], os.environ["ACCORD_RANK"] + ".pids")
with open(path + ".tmp", "w") as fh:
    fh.write(str(os.getpid()))
os.replace(path + ".tmp", path)
time.sleep(60)
"""


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _server_pids(launcher_pid, count, timeout=10.0):
    """The launcher's children running accord.kvstore.server (found through /proc)."""
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    cmdline = fh.read().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue
            if ppid == launcher_pid and b"accord.kvstore.server" in cmdline:
                found.append(int(entry))
        if len(found) >= count or time.monotonic() > deadline:
            return sorted(found)
        time.sleep(0.05)


# --- one real job, several checks ---------------------------------------------------------------

@pytest.fixture(scope="module")
def kv_job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kvjob")
    script = _write(tmp, "kv_job.py", KV_JOB)
    env = lib.cli_env(PS_VERBOSE="2", ACCORD_KVSTORE_BIGARRAY_BOUND="16", ACCORD_KVSTORE_TIMEOUT="20")
    proc = lib.accordrun("-np", str(WORKERS), "--num-servers", str(SERVERS), "--output-filename",
                         str(tmp / "logs"), lib.PYTHON, script, env=env, timeout=60)
    results = {}
    for line in proc.stdout.splitlines():
        if "RESULT " in line:
            data = json.loads(line.split("RESULT ", 1)[1])
            results[data["rank"]] = data
    return proc, results, tmp / "logs"


@pytest.mark.timeout(70)
def test_dist_sync_through_servers_gives_the_sum_of_each_round(kv_job):
    proc, results, _ = kv_job
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(results) == list(range(WORKERS))
    for _rank, data in results.items():
        assert data["num_workers"] == WORKERS and data["num_servers"] == SERVERS
        for r, (big, small) in enumerate(data["sync"], start=1):
            # assign semantics: the stored value is this round's merged push
            expected_big = sum((w + 1) * r for w in range(WORKERS))
            expected_small = sum(r + w for w in range(WORKERS))  # per worker: device values summed
            np.testing.assert_array_equal(big, np.full(40, expected_big, np.float32))
            np.testing.assert_array_equal(small, np.full(3, expected_small, np.float32))


@pytest.mark.timeout(70)
def test_dist_async_with_an_optimizer_on_the_servers(kv_job):
    proc, results, _ = kv_job
    assert proc.returncode == 0, proc.stderr[-3000:]
    total = ASYNC_PUSHES * sum(w + 1.0 for w in range(WORKERS))
    for rank, data in results.items():
        for k, seen in enumerate(data["async"], start=1):
            seen = np.array(seen)
            # includes this worker's own k pushes (w -= lr * g), maybe some of the others'
            assert np.all(seen <= -LR * k * (rank + 1) + 1e-6) and np.all(seen >= -LR * total - 1e-6)
        np.testing.assert_allclose(data["final"], np.full(20, -LR * total))


@pytest.mark.timeout(70)
def test_workers_see_mxnet_environment(kv_job):
    proc, results, _ = kv_job
    assert proc.returncode == 0, proc.stderr[-3000:]
    for data in results.values():
        env = data["env"]
        assert env["DMLC_ROLE"] == "worker"
        assert env["DMLC_NUM_WORKER"] == str(WORKERS) and env["DMLC_NUM_SERVER"] == str(SERVERS)
        # the launcher's store plays ps-lite's scheduler
        assert env["DMLC_PS_ROOT_URI"] == env["ACCORD_STORE_ADDR"] == "127.0.0.1"
        assert env["DMLC_PS_ROOT_PORT"] == env["ACCORD_STORE_PORT"]


@pytest.mark.timeout(70)
def test_server_output_prefixes_files_and_clean_stop(kv_job):
    proc, _, logs = kv_job
    assert proc.returncode == 0, proc.stderr[-3000:]
    for index in range(SERVERS):
        prefix = f"[server{index}]<stderr>:"
        assert f"{prefix}[accord-kvstore server pid " in proc.stderr
        assert f"server {index} registered at tcp://127.0.0.1:" in proc.stderr
        assert f"server {index} stopped" in proc.stderr  # SIGTERM after the workers: clean
        raw = (logs / f"server.{index}" / "stderr").read_text()
        assert f"server {index} registered" in raw and "[server" not in raw  # raw bytes, no prefix
    # PS_VERBOSE=2: every message is logged, e.g. each push of a key piece
    assert "server 0: push s:big#0 from rank 1" in proc.stderr
    assert "job failed" not in proc.stderr and "Root Cause" not in proc.stderr


# --- workers on "remote" hosts (a stand-in ssh that runs them here) -------------------------------

@pytest.mark.timeout(60)
def test_remote_workers_reach_servers_on_the_launch_host(tmp_path, monkeypatch):
    import dataclasses
    import io

    from accord import config
    from accord.run.cli import build_parser
    from accord.run.config.launch_config import config_from_args
    from accord.run.launcher import launch

    script = _write(tmp_path, "kv_job.py", KV_JOB)
    monkeypatch.setenv("FAKE_SSH_LOG", str(tmp_path / "ssh.log"))
    monkeypatch.setenv("MXNET_KVSTORE_BIGARRAY_BOUND", "16")  # forwarded (MXNET_*) to the workers
    monkeypatch.setenv("ACCORD_KVSTORE_TIMEOUT", "20")
    fake = tmp_path / "ssh"
    fake.write_text(f"#!/bin/sh\nexec {lib.PYTHON} {lib.script('fake_ssh.py')} \"$@\"\n")
    fake.chmod(0o755)
    ns = build_parser().parse_args(["--network-interface", "lo", "--grace-period", "1", "-H",
                                    "nodeA:1,nodeB:1", "--num-servers", "2", lib.PYTHON, script])
    cfg = config_from_args(ns, config.snapshot(), cwd=str(tmp_path))
    assert cfg.remote
    cfg = dataclasses.replace(cfg, ssh=dataclasses.replace(cfg.ssh, ssh_binary=str(fake)))
    out, err, messages = io.BytesIO(), io.BytesIO(), io.StringIO()
    code = launch(cfg, out, err, messages)
    assert code == 0, err.getvalue().decode()[-3000:] + messages.getvalue()
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in out.getvalue().decode().splitlines()
               if "RESULT " in line]
    assert sorted(r["rank"] for r in results) == [0, 1]
    for data in results:
        assert data["env"]["DMLC_ROLE"] == "worker" and data["env"]["DMLC_NUM_SERVER"] == "2"
        big, small = data["sync"][-1]
        np.testing.assert_array_equal(big, np.full(40, ROUNDS * sum(w + 1 for w in range(WORKERS))))
        total = ASYNC_PUSHES * sum(w + 1.0 for w in range(WORKERS))
        np.testing.assert_allclose(data["final"], np.full(20, -LR * total))


# --- a server dies mid-job ------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_killed_server_fails_the_job_fast_naming_the_server(tmp_path, killed_tmpdir):
    script = _write(tmp_path, "kv_loop.py", KV_LOOP)
    env = lib.cli_env(ACCORD_KVSTORE_BIGARRAY_BOUND="16", ACCORD_KVSTORE_TIMEOUT="90", TMPDIR=killed_tmpdir)
    launcher = lib.start_accordrun("-np", "2", "--num-servers", "2", "--grace-period", "2",
                                   lib.PYTHON, script, str(tmp_path), env=env)
    pids: list[int] = []
    try:
        servers = _server_pids(launcher.pid, 2)
        assert len(servers) == 2
        try:
            pids = servers + lib.wait_for_pids(tmp_path, 2, timeout=30)  # both workers did a round
        except AssertionError:
            launcher.terminate()
            raise AssertionError(launcher.communicate(timeout=20)[1][-4000:]) from None
        victim = servers[1]
        with open(f"/proc/{victim}/environ", "rb") as fh:
            index = dict(v.split(b"=", 1) for v in fh.read().split(b"\0") if b"=" in v)[b"ACCORD_SERVER_INDEX"]
        os.kill(victim, signal.SIGKILL)
        # the job stops at once, not when the workers' 90 s kvstore timeout runs out: 30 s
        # (a third of it) bounds the wait, and no worker says it got no answer
        out, err = launcher.communicate(timeout=30)
        assert "no answer from parameter server" not in err, err[-3000:]
        assert launcher.returncode == 128 + signal.SIGKILL, err
        cause = err.split("Root Cause (first observed failure):", 1)[1]
        assert f"server     : {index.decode()} (parameter server, host localhost)" in cause
        assert f"pid        : {victim}" in cause and "killed by SIGKILL (signal 9)" in cause
        assert lib.wait_dead(pids, 10) == []  # workers and the other server
    finally:
        lib.reap(launcher, pids)


@pytest.mark.timeout(30)
def test_sigkilled_launcher_leaves_no_server_behind(tmp_path, killed_tmpdir):
    script = _write(tmp_path, "sleeper.py", SLEEPER)
    launcher = lib.start_accordrun("-np", "1", "--num-servers", "2", "--grace-period", "1",
                                   lib.PYTHON, script, str(tmp_path), env=lib.cli_env(TMPDIR=killed_tmpdir))
    pids: list[int] = []
    try:
        pids = _server_pids(launcher.pid, 2) + lib.wait_for_pids(tmp_path, 1)
        assert len(pids) == 3 and all(lib.alive(p) for p in pids)
        launcher.kill()  # no handler runs: the guardian must stop servers and workers
        launcher.communicate(timeout=10)
        assert lib.wait_dead(pids, 10) == []
    finally:
        lib.reap(launcher, pids)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value", ["-1", "two"])
def test_bad_num_servers_exits_2_with_a_hint(value):
    proc = lib.accordrun("-np", "2", "--num-servers", value, lib.PYTHON, "-c", "print('STARTED')")
    assert proc.returncode == 2
    assert f"--num-servers must be a whole number >= 0, got {value!r}" in proc.stderr
    assert "HINT:" in proc.stderr and "STARTED" not in proc.stdout
