"""One agent per node and Kubernetes-shaped jobs on simulated hosts: agents on 2 and 3 hosts
(values, ranks, output), a killed agent (the job stops; with --nnodes 2:3 the others re-form in
memory), --max-restarts with workers killed on another host;
an MPIJob-shaped cluster (StatefulSet host names, sshd on a non-default port, the launcher on a
host that is not in the hostfile), over ssh and over a stand-in rsh agent that enters the hosts'
namespaces without ssh. Every test ends with nothing running on any host (the fixtures check)."""
from __future__ import annotations

import json
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.cluster_jobs import ACCORDRUN, PYTHON, REPO, job_env, reports, wait_for_files
from helpers.elastic_weights import done_lines, expected_linear_params

pytestmark = pytest.mark.timeout(240)

TRAIN = str(REPO / "tests" / "integration" / "scripts" / "agent_train.py")
REPORT = str(REPO / "tests" / "integration" / "scripts" / "report.py")
ELASTIC_TRAIN = str(REPO / "tests" / "integration" / "scripts" / "agent_elastic_train.py")


def _expected_w(steps: int, size: int, lr: float = 0.5) -> float:
    w = 0.0
    for step in range(steps):
        w -= lr * sum((r + 1) * (step + 1) for r in range(size)) / size
    return w


def _secret(folder: Path) -> str:
    path = folder / "secret"
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return str(path)


def _free_port(cluster, host: str) -> int:
    code = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
    return int(cluster.run(host, [PYTHON, "-c", code]).stdout)


def _agents(cluster, hosts: list[str], nproc: int, secret: str, *command: str, extra: tuple[str, ...] = (),
            nnodes: str | None = None):
    port = _free_port(cluster, hosts[0])
    return [cluster.popen(host, [ACCORDRUN, "--nnodes", nnodes or str(len(hosts)), "--node-rank", str(rank),
                                 "--nproc-per-node", str(nproc), "--rdzv-endpoint", f"{hosts[0]}:{port}",
                                 "--secret-file", secret, "--start-timeout", "60", *extra, *command],
                          cwd=str(REPO), env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for rank, host in enumerate(hosts)]


def _finish(procs, timeout: float = 180) -> list[subprocess.CompletedProcess[str]]:
    deadline = time.monotonic() + timeout
    done = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"an agent did not finish:\n{out[-3000:]}\n{err[-3000:]}")
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def test_agents_on_two_hosts_give_ranks_hosts_and_prefixed_output(cluster, shared_dir):
    done = _finish(_agents(cluster, ["h1", "h2"], 2, _secret(shared_dir), PYTHON, REPORT))
    found = {}
    for node, proc in enumerate(done):
        assert proc.returncode == 0, proc.stderr
        for line in proc.stdout.splitlines():
            if "ENV {" in line:
                env = json.loads(line.split("ENV ", 1)[1])
                assert line.startswith(f"[{env['ACCORD_RANK']}]<stdout>:")
                found[int(env["ACCORD_RANK"])] = env
        assert f"[{2 * node}]<stderr>:to stderr from {2 * node}" in proc.stderr
    assert sorted(found) == [0, 1, 2, 3]
    assert [(found[r]["ACCORD_HOSTNAME"], found[r]["ACCORD_LOCAL_RANK"]) for r in range(4)] == \
        [("h1", "0"), ("h1", "1"), ("h2", "0"), ("h2", "1")]
    assert {found[r]["ACCORD_STORE_ADDR"] for r in range(4)} == {"h1"}
    assert {found[r]["MASTER_ADDR"] for r in range(4)} == {"h1"}


def test_agents_on_three_hosts_sum_over_the_job(make_cluster):
    cluster = make_cluster(hosts=3)
    folder = Path(cluster.shared) / "three"
    folder.mkdir(mode=0o777)
    done = _finish(_agents(cluster, ["h1", "h2", "h3"], 2, _secret(folder), PYTHON, TRAIN, "--steps", "3"))
    found = {}
    for proc in done:
        assert proc.returncode == 0, proc.stderr
        found.update(reports(proc.stdout, "RESULT"))
    assert sorted(found) == list(range(6))
    assert all(v["w"] == pytest.approx(_expected_w(3, 6)) for v in found.values())


def test_a_killed_agent_stops_the_job_and_its_workers(cluster, shared_dir):
    procs = _agents(cluster, ["h1", "h2"], 1, _secret(shared_dir), PYTHON, TRAIN, "--steps", "2",
                    "--pid-dir", str(shared_dir), "--sleep", "120")
    try:
        wait_for_files([shared_dir / "0.0.pid", shared_dir / "0.1.pid"], timeout=90, proc=procs[0])
        procs[1].send_signal(signal.SIGKILL)  # nsenter exec'd accordrun: h2's agent
        done = _finish(procs, 90)
        assert done[0].returncode == 1, done[0].stderr
        assert "the agent of node 1 on h2 stopped answering" in done[0].stderr
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    # h2's worker was stopped by its agent's guardian: the cluster fixture finds nothing left


def test_nnodes_2_3_a_killed_agent_is_left_behind_and_the_others_reform_in_memory(make_cluster):
    """Three hosts, --nnodes 2:3: h2's agent is SIGKILLed before step 3; the workers on h1 and h3
    re-form as a job of 2 (no restart) and end with the weights of 3 steps on 3, then 3 on 2."""
    cluster = make_cluster(hosts=3)
    folder = Path(cluster.shared) / "reform"
    folder.mkdir(mode=0o777)
    hold = folder / "go"
    procs = _agents(cluster, ["h1", "h2", "h3"], 1, _secret(folder), PYTHON, ELASTIC_TRAIN, "--steps", "6",
                    "--pid-dir", str(folder), "--hold-step", "3", "--hold-file", str(hold), nnodes="2:3")
    try:
        wait_for_files([folder / f"{m}.held" for m in range(3)], timeout=120, proc=procs[0])
        procs[1].send_signal(signal.SIGKILL)  # nsenter exec'd accordrun: h2's agent
        procs[1].communicate()
        hold.touch()
        done = _finish([procs[0], procs[2]], 120)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert done[0].returncode == 0 and done[1].returncode == 0, done[0].stderr + done[1].stderr
    finished = done_lines(done[0].stdout) + done_lines(done[1].stdout)
    assert sorted((d["member"], d["rank"]) for d in finished) == [(0, 0), (2, 1)]
    expected = expected_linear_params([3, 3, 3, 2, 2, 2])
    for d in finished:
        assert d["sizes"] == [3, 3, 3, 2, 2, 2] and d["restart"] == "0"
        assert d["pid"] == int((folder / f"{d['member']}.pid").read_text())  # never restarted
        assert d["weight"] + d["bias"] == pytest.approx(expected, abs=1e-6)
    assert "the agent of node 1 on h2 stopped answering" in done[0].stderr
    assert "the job goes on in memory with nodes [0, 2]" in done[0].stderr
    # h2's worker was stopped by its agent's guardian: the fixture finds nothing left on any host


def test_max_restarts_2_with_workers_killed_on_another_host_ends_like_an_uninterrupted_run(cluster, shared_dir):
    ckpt = str(shared_dir / "ckpt.json")
    done = _finish(_agents(cluster, ["h1", "h2"], 2, _secret(shared_dir), PYTHON, TRAIN, "--steps", "5",
                           "--ckpt", ckpt, "--fail", "0:1:3:kill", "--fail", "1:3:2:kill",
                           extra=("--max-restarts", "2")))
    found = {}
    for proc in done:
        assert proc.returncode == 0, proc.stderr
        assert "restart 2 of 2" in proc.stderr
        found.update(reports(proc.stdout, "RESULT"))
    assert sorted(found) == [0, 1, 2, 3]
    assert all(v["w"] == pytest.approx(_expected_w(5, 4)) and v["attempt"] == 2 for v in found.values())


def test_a_third_failure_ends_the_job_with_its_root_cause_on_every_agent(cluster, shared_dir):
    fails = [a for attempt in range(3) for a in ("--fail", f"{attempt}:1:3")]
    done = _finish(_agents(cluster, ["h1", "h2"], 2, _secret(shared_dir), PYTHON, TRAIN, "--steps", "3", *fails,
                           extra=("--max-restarts", "2")))
    for proc in done:
        assert proc.returncode == 3, proc.stderr
        last = proc.stderr.rsplit("Root Cause (first observed failure):", 1)[1]
        assert "rank       : 3 (local_rank 1, host h2)" in last and "failing at step 1 of attempt 2" in last


# --- an MPIJob: StatefulSet names, sshd on port 2222, the launcher outside the hostfile -------------

WORKERS = ["job-worker-0.job-worker", "job-worker-1.job-worker"]


def _mpijob(make_cluster):
    cluster = make_cluster(names=["job-launcher", *WORKERS], ssh_port=2222)
    folder = Path(cluster.shared) / "mpijob"
    folder.mkdir(mode=0o777)
    hostfile = folder / "hostfile"
    hostfile.write_text("".join(f"{w} slots=2\n" for w in WORKERS))
    return cluster, folder, hostfile


def test_mpijob_over_ssh_on_port_2222_from_a_launcher_outside_the_hostfile(make_cluster):
    cluster, _, hostfile = _mpijob(make_cluster)
    res = cluster.run("job-launcher", [ACCORDRUN, "-np", "4", "-p", "2222", PYTHON, TRAIN, "--steps", "3"],
                      timeout=180, cwd=str(REPO), env=job_env(OMPI_MCA_orte_default_hostfile=str(hostfile)))
    assert res.returncode == 0, res.stderr
    found = reports(res.stdout, "RESULT")
    assert sorted(found) == [0, 1, 2, 3]
    assert all(v["w"] == pytest.approx(_expected_w(3, 4)) for v in found.values())


def _rsh_agent(cluster, folder: Path) -> str:
    """A stand-in for the operator's kubexec.sh: ``agent HOST SCRIPT`` runs SCRIPT inside HOST's
    namespaces (nsenter, no ssh), stdin passed through."""
    return cluster.write_rsh_agent(str(folder / "kubexec.sh"), WORKERS)


def test_mpijob_through_a_stand_in_rsh_agent_runs_and_reports_a_killed_worker(make_cluster):
    cluster, folder, hostfile = _mpijob(make_cluster)
    # no -p 2222: ssh to port 22 would be refused, so only the agent can start these workers
    env = job_env(OMPI_MCA_orte_default_hostfile=str(hostfile), OMPI_MCA_plm_rsh_agent=_rsh_agent(cluster, folder))
    res = cluster.run("job-launcher", [ACCORDRUN, "-np", "4", PYTHON, TRAIN, "--steps", "3"], timeout=180,
                      cwd=str(REPO), env=env)
    assert res.returncode == 0, res.stderr
    found = reports(res.stdout, "RESULT")
    assert sorted(found) == [0, 1, 2, 3] and all(v["w"] == pytest.approx(_expected_w(3, 4)) for v in found.values())
    res = cluster.run("job-launcher", [ACCORDRUN, "-np", "4", "--grace-period", "1", PYTHON, TRAIN, "--steps", "3",
                                       "--fail", "0:1:2:kill"], timeout=180, cwd=str(REPO), env=env)
    assert res.returncode == 137, res.stderr
    cause = res.stderr.split("Root Cause (first observed failure):")[1]
    assert f"rank       : 2 (local_rank 0, host {WORKERS[1]})" in cause and "exit code 137" in cause
