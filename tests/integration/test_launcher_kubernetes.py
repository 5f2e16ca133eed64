"""Kubernetes' two contracts through the real CLI, on this host: the MPI Operator's launcher pod
(`accordrun -np 4` with no -H reads OMPI_MCA_orte_default_hostfile and starts workers through
OMPI_MCA_plm_rsh_agent, here a stand-in that runs the remote script locally), and a
PyTorchJob's pods running the script directly (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK)."""
import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest

_here = Path(__file__).parent / "scripts"
_spec = importlib.util.spec_from_file_location("agents_testlib", _here / "agents_testlib.py")
ag = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ag)
lib = ag.lib


def _operator_env(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("job-worker-0.job-worker slots=2\njob-worker-1.job-worker slots=2\n")
    agent = tmp_path / "kubexec.sh"  # the operator's kubexec.sh: POD, then the command
    agent.write_text(f"#!/bin/sh\nexec {lib.PYTHON} {lib.script('fake_ssh.py')} \"$@\"\n")
    agent.chmod(0o755)
    return lib.cli_env(OMPI_MCA_orte_default_hostfile=str(hostfile), OMPI_MCA_plm_rsh_agent=f"{agent} : ssh",
                       FAKE_SSH_LOG=str(tmp_path / "rsh.log"))


@pytest.mark.timeout(60)
def test_mpijob_launcher_reads_the_hostfile_and_uses_the_rsh_agent(tmp_path):
    env = _operator_env(tmp_path)
    proc = lib.accordrun("--network-interface", "lo", "-np", "4", lib.PYTHON, lib.script("agent_train.py"),
                         "--steps", "2", env=env, timeout=50)
    assert proc.returncode == 0, proc.stderr
    found = ag.results(proc.stdout)
    assert sorted(found) == [0, 1, 2, 3] and len({v["w"] for v in found.values()}) == 1
    calls = [json.loads(line) for line in (tmp_path / "rsh.log").read_text().splitlines()]
    assert sorted(c[0] for c in calls) == ["job-worker-0.job-worker"] * 2 + ["job-worker-1.job-worker"] * 2
    assert all(len(c) == 2 and "BatchMode=yes" not in c for c in calls)  # host and script, not ssh's options
    assert not re.search(r"[0-9a-f]{64}", (tmp_path / "rsh.log").read_text())  # the secret went on stdin


@pytest.mark.timeout(60)
def test_mpijob_killed_worker_is_the_root_cause(tmp_path):
    env = _operator_env(tmp_path)
    proc = lib.accordrun("--network-interface", "lo", "-np", "4", "--grace-period", "1", lib.PYTHON,
                         lib.script("agent_train.py"), "--steps", "3", "--fail", "0:1:2:kill", env=env, timeout=50)
    assert proc.returncode == 137, proc.stderr
    cause = proc.stderr.split("Root Cause (first observed failure):")[1]
    assert "rank       : 2 (local_rank 0, host job-worker-1.job-worker)" in cause
    assert "status     : exit code 137" in cause  # 128 + SIGKILL, as the remote shell reports it


@pytest.mark.timeout(30)
def test_an_rsh_agent_that_does_not_exist_exits_2_with_a_hint(tmp_path):
    env = _operator_env(tmp_path)
    env["OMPI_MCA_plm_rsh_agent"] = str(tmp_path / "missing.sh")
    proc = lib.accordrun("-np", "4", lib.PYTHON, "-c", "pass", env=env, timeout=20)
    assert proc.returncode == 2 and "OMPI_MCA_plm_rsh_agent" in proc.stderr and "HINT:" in proc.stderr


@pytest.mark.timeout(60)
def test_pytorchjob_pods_run_the_script_directly_one_worker_each():
    port = ag.free_port()
    pods = [subprocess.Popen([lib.PYTHON, lib.script("accord_init.py")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True,
                             env={k: v for k, v in lib.cli_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                                               WORLD_SIZE="2", RANK=str(r),
                                                               KUBERNETES_PORT="tcp://10.96.0.1:443").items()
                                  if not k.startswith(("ACCORD_", "HOROVOD_", "PET_"))})
            for r in (0, 1)]
    done = ag.finish(pods, 50)
    local_ranks = set()
    for r, proc in enumerate(done):
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout.split("RESULT ", 1)[1])
        local_ranks.add(result.pop("local_rank"))
        assert result == {"source": "torchrun", "rank": r, "size": 2, "sum": 3.0}
    assert local_ranks == {0, 1}  # two "pods" on one machine: one host for the topology


@pytest.mark.timeout(30)
def test_pet_nproc_per_node_2_without_an_agent_fails_fast_with_a_hint():
    env = lib.cli_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ag.free_port()), WORLD_SIZE="4", RANK="0",
                      PET_NPROC_PER_NODE="2", PET_NNODES="2", KUBERNETES_PORT="tcp://10.96.0.1:443")
    proc = subprocess.run([lib.PYTHON, lib.script("accord_init.py")], capture_output=True, text=True,
                          env=env, timeout=25)
    assert proc.returncode != 0
    assert "PET_NPROC_PER_NODE=2 asks for 2 workers" in proc.stderr and "HINT:" in proc.stderr
