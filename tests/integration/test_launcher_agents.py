"""One agent per node (accordrun --nnodes/--node-rank/--rdzv-endpoint), through the real CLI:
several agents as separate processes on this host, meeting on loopback. Values, ranks and
output; a failure on one node stops every node with the root cause on every agent; agents
that disagree, a wrong secret, an unreachable endpoint; --nnodes MIN:MAX re-forming in memory (a
killed agent, a killed worker, a node admitted); Kubernetes' PET_* and SLURM's
variables; whole-job restarts (--max-restarts) that resume from the checkpoint."""
import importlib.util
import os
import signal
import time
from pathlib import Path

import pytest
from helpers.elastic_weights import done_lines, expected_linear_params

_here = Path(__file__).parent / "scripts"
_spec = importlib.util.spec_from_file_location("agents_testlib", _here / "agents_testlib.py")
ag = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ag)
lib = ag.lib

TRAIN = lib.script("agent_train.py")
FAIL = lib.script("fail.py")


def _expected_w(steps: int, size: int, lr: float = 0.5) -> float:
    """The uninterrupted run's weight, computed here (not by the script)."""
    w = 0.0
    for step in range(steps):
        w -= lr * sum((r + 1) * (step + 1) for r in range(size)) / size
    return w


@pytest.mark.timeout(90)
def test_two_agents_give_each_worker_its_place_and_prefix_its_output(tmp_path):
    port, secret = ag.free_port(), ag.secret_file(tmp_path)
    done = ag.run_agents([ag.agent_args(2, r, 2, port, secret, lib.PYTHON, lib.script("report.py"))
                          for r in (0, 1)])
    for proc in done:
        assert proc.returncode == 0, proc.stderr
    reports = {}
    for r, proc in enumerate(done):
        node = lib.env_reports(proc.stdout)
        assert sorted(node) == [2 * r, 2 * r + 1]  # node r runs ranks r*P .. r*P+P-1
        reports.update(node)
        assert f"[{2 * r}]<stderr>:to stderr from {2 * r}" in proc.stderr
    for rank, env in reports.items():
        assert env["ACCORD_SIZE"] == "4" and env["WORLD_SIZE"] == "4"
        assert env["ACCORD_LOCAL_RANK"] == str(rank % 2) and env["ACCORD_LOCAL_SIZE"] == "2"
        assert env["ACCORD_CROSS_RANK"] == str(rank // 2) and env["ACCORD_CROSS_SIZE"] == "2"
        assert env["GROUP_RANK"] == str(rank // 2)
        assert env["ACCORD_STORE_ADDR"] == "127.0.0.1" and env["MASTER_ADDR"] == "127.0.0.1"
        assert env["secret_len"] == 64
    assert len({e["ACCORD_STORE_PORT"] for e in reports.values()}) == 1
    assert len({e["ACCORD_JOB_ID"] for e in reports.values()}) == 1
    assert reports[0]["ACCORD_HOSTNAME"] != reports[2]["ACCORD_HOSTNAME"]  # two nodes for the topology


@pytest.mark.timeout(90)
def test_three_agents_without_node_ranks_sum_over_the_job_store(tmp_path):
    port, secret = ag.free_port(), ag.secret_file(tmp_path)
    done = ag.run_agents([ag.agent_args(3, None, 1, port, secret, lib.PYTHON, TRAIN, "--steps", "3")
                          for _ in range(3)])
    found = {}
    for proc in done:
        assert proc.returncode == 0, proc.stderr
        found.update(ag.results(proc.stdout))
    assert sorted(found) == [0, 1, 2]
    assert all(v["w"] == pytest.approx(_expected_w(3, 3)) and v["size"] == 3 for v in found.values())


@pytest.mark.timeout(90)
def test_failure_on_one_node_stops_every_node_with_the_root_cause(tmp_path):
    port, secret = ag.free_port(), ag.secret_file(tmp_path)
    done = ag.run_agents([ag.agent_args(2, r, 2, port, secret, lib.PYTHON, FAIL, "--pid-dir", str(tmp_path),
                                        "--fail-rank", "3", "--mode", "raise") for r in (0, 1)])
    pids = [int(p) for f in tmp_path.glob("*.pids") for p in f.read_text().split()]
    try:
        for proc in done:
            assert proc.returncode == 1, proc.stderr
            cause = proc.stderr.split("Root Cause (first observed failure):")[1]
            assert "rank       : 3 (local_rank 1" in cause
            assert "error      : ValueError: bad value on rank 3" in cause
        assert "Stopped by the launcher: ranks 0, 1" in done[0].stderr  # node 0's workers were stopped
        for proc in done:  # node 0 reported its (stopped, not failed) workers too: nobody waited it out
            assert "reported nothing about their workers" not in proc.stderr, proc.stderr
        assert len(pids) == 4 and lib.wait_dead(pids, 10) == []
    finally:
        lib.kill_all(pids)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig, said", [(signal.SIGKILL, "stopped answering"),  # the agent died
                                       (signal.SIGTERM, "received SIGTERM")])  # Kubernetes deleting the pod
def test_a_stopped_agent_stops_the_others_and_its_workers(tmp_path, sig, said):
    port, secret = ag.free_port(), ag.secret_file(tmp_path)
    procs = ag.start_agents([ag.agent_args(2, r, 1, port, secret, lib.PYTHON, FAIL, "--pid-dir", str(tmp_path))
                             for r in (0, 1)])
    pids = []
    try:
        pids = lib.wait_for_pids(tmp_path, 2, timeout=30)
        os.kill(procs[1].pid, sig)  # the agent of node 1 (its workers have their own sessions)
        done = ag.finish(procs, 60)
        assert done[0].returncode == 1, done[0].stderr
        assert "the agent of node 1" in done[0].stderr and said in done[0].stderr
        if sig == signal.SIGTERM:
            assert done[1].returncode == 128 + signal.SIGTERM, done[1].stderr
        assert lib.wait_dead(pids, 15) == []  # node 1's worker: stopped by its agent, or its guardian
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        lib.kill_all(pids)


@pytest.mark.timeout(150)
def test_max_restarts_2_with_a_worker_killed_twice_ends_like_an_uninterrupted_run(tmp_path):
    port, secret = ag.free_port(), ag.secret_file(tmp_path)
    ckpt = str(tmp_path / "ckpt.json")
    script = [lib.PYTHON, TRAIN, "--steps", "6", "--ckpt", ckpt, "--fail", "0:2:3:kill", "--fail", "1:4:1"]
    done = ag.run_agents([ag.agent_args(2, r, 2, port, secret, "--max-restarts", "2", *script) for r in (0, 1)],
                         timeout=120)
    found, attempts = {}, {}
    for proc in done:
        assert proc.returncode == 0, proc.stderr
        assert "restarting every node's workers (restart 2 of 2)" in proc.stderr
        found.update(ag.results(proc.stdout))
        attempts.update(ag.results(proc.stdout, "ATTEMPT"))
    assert sorted(found) == [0, 1, 2, 3]
    assert all(v["w"] == pytest.approx(_expected_w(6, 4)) and v["attempt"] == 2 for v in found.values())
    # the third attempt resumed from the checkpoint, and saw both restart counts
    assert all(a["attempt"] == 2 and a["start"] == 4 and a["torch_count"] == "2" for a in attempts.values())


@pytest.mark.timeout(150)
def test_a_failure_past_max_restarts_ends_the_job_with_its_root_cause(tmp_path):
    port, secret = ag.free_port(), ag.secret_file(tmp_path)
    script = [lib.PYTHON, TRAIN, "--steps", "4", "--fail", "0:1:2", "--fail", "1:1:2", "--fail", "2:1:2"]
    done = ag.run_agents([ag.agent_args(2, r, 2, port, secret, "--max-restarts", "2", *script) for r in (0, 1)],
                         timeout=120)
    for proc in done:
        assert proc.returncode == 3, proc.stderr
        assert "no restart left (--max-restarts 2)" in proc.stderr
        last = proc.stderr.rsplit("Root Cause (first observed failure):", 1)[1]
        assert "rank       : 2 (local_rank 0" in last and "exit code 3" in last
        assert "failing at step 1 of attempt 2" in last


@pytest.mark.timeout(60)
def test_agents_that_disagree_fail_on_every_agent_and_start_nothing(tmp_path):
    port, secret = ag.free_port(), ag.secret_file(tmp_path)
    done = ag.run_agents([ag.agent_args(2, 0, 2, port, secret, lib.PYTHON, FAIL, "--pid-dir", str(tmp_path)),
                          ag.agent_args(2, 1, 3, port, secret, lib.PYTHON, FAIL, "--pid-dir", str(tmp_path))])
    for proc in done:
        assert proc.returncode == 2, proc.stderr
        assert "the agents disagree on the job" in proc.stderr and "--nproc-per-node 3" in proc.stderr
        assert "HINT:" in proc.stderr
    assert list(tmp_path.glob("*.pids")) == []


@pytest.mark.timeout(60)
def test_a_wrong_secret_fails_on_every_agent_within_the_start_timeout(tmp_path):
    port = ag.free_port()
    good, bad = ag.secret_file(tmp_path, "good"), ag.secret_file(tmp_path, "bad")
    done = ag.run_agents([ag.agent_args(2, 0, 1, port, good, "--start-timeout", "4", lib.PYTHON, FAIL,
                                        "--pid-dir", str(tmp_path)),
                          ag.agent_args(2, 1, 1, port, bad, "--start-timeout", "4", lib.PYTHON, FAIL,
                                        "--pid-dir", str(tmp_path))])
    assert done[0].returncode == 1 and "did not join" in done[0].stderr and "another secret" in done[0].stderr
    assert done[1].returncode == 1 and "could not reach the job's rendezvous" in done[1].stderr
    assert all("HINT:" in d.stderr for d in done)
    assert list(tmp_path.glob("*.pids")) == []


@pytest.mark.timeout(60)
def test_an_unreachable_endpoint_fails_within_the_start_timeout(tmp_path):
    port, secret = ag.free_port(), ag.secret_file(tmp_path)
    [proc] = ag.run_agents([ag.agent_args(2, 1, 1, port, secret, "--start-timeout", "2", lib.PYTHON, FAIL,
                                          "--pid-dir", str(tmp_path))])
    assert proc.returncode == 1
    assert f"could not reach the job's rendezvous at 127.0.0.1:{port}" in proc.stderr and "HINT:" in proc.stderr


@pytest.mark.parametrize("args, expected", [
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:1", "-np", "2"], "-np cannot be used"),
    (["--nnodes", "3:2", "--rdzv-endpoint", "127.0.0.1:1", "--no-job-secret"], "--nnodes '3:2'"),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:1", "--no-job-secret"],
     "is not a node rank"),
    (["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:99999", "--no-job-secret"], "is not HOST:PORT"),
    (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:1"], "needs the job's secret"),
    (["-np", "2", "--max-restarts", "1"], "are for one agent per node"),
])
@pytest.mark.timeout(30)
def test_bad_agent_arguments_exit_2_with_a_hint(args, expected):
    proc = lib.accordrun(*args, lib.PYTHON, "-c", "pass", timeout=20,
                         env=lib.cli_env(PET_NNODES=None, MASTER_ADDR=None, MASTER_PORT=None))
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr and "HINT:" in proc.stderr


@pytest.mark.timeout(90)
def test_pytorchjob_pet_variables_make_each_accordrun_a_node_agent(tmp_path):
    port, secret = ag.free_port(), ag.secret_file(tmp_path)
    envs = [lib.cli_env(PET_NNODES="2", PET_NODE_RANK=str(r), PET_NPROC_PER_NODE="1", PET_MASTER_ADDR="127.0.0.1",
                        PET_MASTER_PORT=str(port), ACCORD_JOB_SECRET_FILE=secret) for r in (0, 1)]
    done = ag.run_agents([[lib.PYTHON, TRAIN, "--steps", "2"]] * 2, envs=envs)
    found = {}
    for proc in done:
        assert proc.returncode == 0, proc.stderr
        found.update(ag.results(proc.stdout))
    assert sorted(found) == [0, 1] and found[1]["w"] == pytest.approx(_expected_w(2, 2))


@pytest.mark.timeout(90)
def test_srun_variables_make_each_accordrun_a_node_agent(tmp_path):
    port, secret = ag.free_port(), ag.secret_file(tmp_path)
    envs = [lib.cli_env(SLURM_STEP_ID="0", SLURM_NNODES="2", SLURM_NODEID=str(r),
                        SLURM_JOB_NODELIST="localhost,node[2-3]", MASTER_PORT=str(port),
                        ACCORD_JOB_SECRET_FILE=secret) for r in (0, 1)]
    done = ag.run_agents([["--nproc-per-node", "2", lib.PYTHON, TRAIN, "--steps", "2"]] * 2, envs=envs)
    found = {}
    for proc in done:
        assert proc.returncode == 0, proc.stderr
        found.update(ag.results(proc.stdout))
    assert sorted(found) == [0, 1, 2, 3] and found[3]["w"] == pytest.approx(_expected_w(2, 4))


def _uninterrupted_weights(mode: str, epochs: int = 4, size: int = 2) -> list[float]:
    """What agent_resume.py's training ``mode`` ends with when nothing fails, computed here with
    plain torch: the same data and initial weights, each rank's batches (``fit``: the shards of
    torch's own DistributedSampler, seed 0, shuffled per epoch; ``state``: the script's slices),
    their gradients averaged, SGD with momentum 0.9 and lr 0.1 written out."""
    import numpy as np
    import torch
    from torch.utils.data import DistributedSampler

    rng = np.random.default_rng(0)
    x_np = rng.normal(size=(32, 4)).astype(np.float32)
    x, y = torch.from_numpy(x_np), torch.from_numpy((x_np.sum(axis=1) > 0).astype(np.int64))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = torch.nn.Linear(4, 2)
    if mode == "fit":
        steps = []
        for epoch in range(epochs):
            batches = []
            for rank in range(size):
                sampler = DistributedSampler(range(len(x)), num_replicas=size, rank=rank, shuffle=True, seed=0)
                sampler.set_epoch(epoch)
                order = list(sampler)
                batches.append([order[i:i + 4] for i in range(0, len(order), 4)])
            steps += list(zip(*batches))  # step b: every rank's batch b
    else:
        steps = [[list(range(r * 4 + s % 2 * 8, r * 4 + s % 2 * 8 + 4)) for r in range(size)] for s in range(epochs)]
    params, velocity = list(net.parameters()), None
    for batches in steps:
        grads = []
        for idx in batches:
            net.zero_grad()
            torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
            grads.append([p.grad.clone() for p in params])
        mean = [sum(g[i] for g in grads) / size for i in range(len(params))]
        velocity = mean if velocity is None else [0.9 * v + g for v, g in zip(velocity, mean)]
        with torch.no_grad():
            for p, v in zip(params, velocity):
                p -= 0.1 * v
    return [float(v) for v in torch.cat([p.detach().flatten() for p in params])]


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """Two agents x 1 worker of agent_resume.py with --max-restarts 2, killed twice: rank 1 at
    epoch/step 1 of the first attempt, rank 0 at 3 of the second. One job for both cases (each
    worker trains both ways): each of its six torch workers takes seconds to start. Each rank's
    results, and the agents."""
    folder = tmp_path_factory.mktemp("resume")
    port, secret = ag.free_port(), ag.secret_file(folder)
    script = [lib.PYTHON, lib.script("agent_resume.py"), "--dir", str(folder), "--fail", "0:1:1", "--fail", "1:3:0"]
    done = ag.run_agents([ag.agent_args(2, r, 1, port, secret, "--max-restarts", "2", *script) for r in (0, 1)],
                         timeout=240)
    for proc in done:
        assert proc.returncode == 0, proc.stderr[-5000:]
    return {**ag.results(done[0].stdout), **ag.results(done[1].stdout)}, done


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["fit", "state"])
def test_restarts_resume_fit_and_torch_state_from_disk_to_the_uninterrupted_weights(resumed_run, mode):
    found, done = resumed_run
    assert sorted(found) == [0, 1]
    assert len({tuple(v[mode]) for v in found.values()}) == 1  # every rank ends the same
    assert found[0]["attempt"] == 2
    assert found[0][mode] == pytest.approx(_uninterrupted_weights(mode), abs=1e-5)
    if mode == "state":
        starts = ag.results(done[0].stdout, "RESUMED")
        assert starts[0] == {"rank": 0, "resumed": True, "step": 3}


@pytest.mark.timeout(90)
def test_nnodes_min_max_starts_with_the_agents_that_came(tmp_path):
    port, secret = ag.free_port(), ag.secret_file(tmp_path)
    done = ag.run_agents([ag.agent_args("1:3", None, 2, port, secret, lib.PYTHON, TRAIN, "--steps", "2")
                          for _ in range(2)])
    found = {}
    for proc in done:
        assert proc.returncode == 0, proc.stderr
        found.update(ag.results(proc.stdout))
    assert sorted(found) == [0, 1, 2, 3] and all(v["size"] == 4 for v in found.values())


@pytest.mark.timeout(120)
def test_an_agent_that_restarts_rejoins_and_the_job_restarts_with_it(tmp_path):
    """A Kubernetes pod restarted: its new agent joins the running job, which restarts every
    node's workers (--max-restarts) and finishes from the checkpoint."""
    port, secret = ag.free_port(), ag.secret_file(tmp_path)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    ckpt = str(tmp_path / "ckpt.json")

    def agent(rank):
        return ag.agent_args(2, rank, 1, port, secret, "--max-restarts", "1", lib.PYTHON, TRAIN, "--steps", "2",
                             "--ckpt", ckpt, "--pid-dir", str(pid_dir), "--sleep", "60")

    first = ag.start_agents([agent(0), agent(1)])
    replacement = []
    try:
        deadline = time.monotonic() + 30
        while len(list(pid_dir.glob("0.*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(first[1].pid, signal.SIGKILL)
        first[1].communicate()
        replacement = ag.start_agents([agent(1)])  # (the second attempt does not sleep)
        done = ag.finish([first[0], *replacement], 90)
    finally:
        for proc in [*first, *replacement]:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        lib.kill_all([int(p.read_text()) for p in pid_dir.glob("*.pid")])
    assert done[0].returncode == 0 and done[1].returncode == 0, done[0].stderr + done[1].stderr
    assert "restart 1 of 1" in done[0].stderr
    found = {**ag.results(done[0].stdout), **ag.results(done[1].stdout)}
    assert sorted(found) == [0, 1] and all(v["attempt"] == 1 for v in found.values())


ELASTIC = lib.script("agent_elastic_train.py")


def _wait_files(folder: Path, names: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not all((folder / n).exists() for n in names):
        assert time.monotonic() < deadline, f"no {names} in {sorted(os.listdir(folder))} after {timeout}s"
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_an_agent_killed_mid_training_the_survivors_reform_in_memory_and_finish(tmp_path):
    """--nnodes 2:3, 3 agents x 1 worker: node 1's agent is SIGKILLed before step 3; the workers of
    nodes 0 and 2 re-form as a job of 2 without restarting and finish from the last commit."""
    port, secret = ag.free_port(), ag.secret_file(tmp_path)
    pid_dir, hold = tmp_path / "pids", tmp_path / "go"
    pid_dir.mkdir()
    agents = ag.start_agents([ag.agent_args("2:3", r, 1, port, secret, lib.PYTHON, ELASTIC, "--steps", "6",
                                            "--pid-dir", str(pid_dir), "--hold-step", "3", "--hold-file", str(hold))
                              for r in range(3)])
    pids: dict[int, int] = {}
    try:
        _wait_files(pid_dir, ["0.held", "1.held", "2.held"])  # 3 steps done on 3 workers
        pids = {m: int((pid_dir / f"{m}.pid").read_text()) for m in range(3)}
        os.kill(agents[1].pid, signal.SIGKILL)
        assert lib.wait_dead([pids[1]], timeout=30) == []  # its guardian stopped its worker
        hold.touch()
        done = ag.finish([agents[0], agents[2]], 90)
    finally:
        for proc in agents:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        lib.kill_all(list(pids.values()))
    assert done[0].returncode == 0 and done[1].returncode == 0, done[0].stderr[-4000:] + done[1].stderr[-4000:]
    finished = done_lines(done[0].stdout) + done_lines(done[1].stdout)
    assert sorted((d["member"], d["rank"]) for d in finished) == [(0, 0), (2, 1)]  # renumbered
    expected = expected_linear_params([3, 3, 3, 2, 2, 2])
    for d in finished:
        assert d["sizes"] == [3, 3, 3, 2, 2, 2]  # three committed steps on 3 workers, then 2
        assert d["pid"] == pids[d["member"]] and d["restart"] == "0"  # the same processes throughout
        assert d["weight"] + d["bias"] == pytest.approx(expected, abs=1e-6)
    assert "the job goes on in memory with nodes [0, 2]" in done[0].stderr
    assert lib.wait_dead(list(pids.values())) == []


@pytest.mark.timeout(120)
def test_a_third_agent_joining_a_two_agent_job_is_admitted(tmp_path):
    """--nnodes 2:3: the job forms with 2 agents; a third that arrives while it trains is admitted
    and its worker joins at the next re-formation, with the state of the last commit."""
    port, secret = ag.free_port(), ag.secret_file(tmp_path)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()

    def agent(rank):
        return ag.agent_args("2:3", rank, 1, port, secret, lib.PYTHON, ELASTIC, "--steps", "4",
                             "--until-size", "3", "--step-sleep", "0.05", "--pid-dir", str(pid_dir))

    first = ag.start_agents([agent(0), agent(1)])
    late = []
    try:
        _wait_files(pid_dir, ["0.pid", "1.pid"])  # the job formed with 2 nodes
        late = ag.start_agents([agent(2)])
        done = ag.finish([*first, *late], 100)
    finally:
        for proc in [*first, *late]:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        lib.kill_all([int(p.read_text()) for p in pid_dir.glob("*.pid")])
    assert [d.returncode for d in done] == [0, 0, 0], "\n".join(d.stderr[-3000:] for d in done)
    finished = [d for proc in done for d in done_lines(proc.stdout)]
    assert sorted((d["member"], d["rank"]) for d in finished) == [(0, 0), (1, 1), (2, 2)]
    sizes = finished[0]["sizes"]
    grown = sizes.index(3)
    assert sizes == [2] * grown + [3] * (len(sizes) - grown) and len(sizes) >= 4
    expected = expected_linear_params(sizes)
    for d in finished:
        assert d["sizes"] == sizes and d["weight"] + d["bias"] == pytest.approx(expected, abs=1e-6)
        assert d["pid"] == int((pid_dir / f"{d['member']}.pid").read_text())
    assert "elastic: admitted node 2" in done[0].stderr
    assert "joined the running job as node 2" in done[2].stderr


@pytest.mark.timeout(120)
def test_a_killed_worker_takes_its_node_out_and_below_min_the_job_stops_with_its_root_cause(tmp_path):
    """--nnodes 2:3: node 2's worker dies before step 2: node 2 leaves (its agent prints why and
    exits 137), nodes 0 and 1 go on as 2 workers; node 1's worker dies before step 4: one node
    would remain, so node 0 stops with node 1's failure as the root cause."""
    port, secret = ag.free_port(), ag.secret_file(tmp_path)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    done = ag.run_agents([ag.agent_args("2:3", r, 1, port, secret, lib.PYTHON, ELASTIC, "--steps", "8",
                                        "--pid-dir", str(pid_dir), "--die", "2:2", "--die", "1:4")
                          for r in range(3)], timeout=100)
    assert [d.returncode for d in done] == [137, 137, 137], "\n".join(d.stderr[-3000:] for d in done)
    for node in (1, 2):
        box = done[node].stderr.split(f"accordrun: node {node} leaves the job after its workers failed")[1]
        assert f"rank       : {node} (local_rank 0" in box and "killed by SIGKILL (signal 9)" in box
    assert "node 2 on" in done[0].stderr and "the job goes on in memory with nodes [0, 1]" in done[0].stderr
    cause = done[0].stderr.split("accordrun: job failed (seen by node 0 of 3; the failure is on node 1)")[1]
    assert "rank       : 1 (local_rank 0" in cause
    assert not done_lines(done[0].stdout)  # training did not finish
    assert lib.wait_dead([int(p.read_text()) for p in pid_dir.glob("*.pid")]) == []
