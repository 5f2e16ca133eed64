"""One agent per node on simulated hosts: accordrun's agents against torchrun's.

    python benchmarks/cluster_agents.py [--repeats 3] [--parts startup,restart,in-memory]

- ``startup`` (2 hosts x 2 workers, benchmarks/agent_steps.py: torch.distributed on gloo, env://,
  under both): from starting the two agents to rank 0's first allreduce done (``--nnodes 2``).
- ``restart`` (same hosts and worker): from a worker SIGKILLed at step 5 to the job's next step,
  with ``--nnodes 2`` (``--restart-nnodes``) ``--max-restarts 3`` (torchrun: ``--rdzv-backend
  c10d``); both restart every worker, which resumes from the step rank 0 wrote to disk.
- ``in-memory`` (3 hosts x 2 workers, ``--nnodes 2:3``): from a worker SIGKILLed at step 5 to the
  job's next step. accord: benchmarks/agent_elastic_steps.py (the same loop under
  ``hvd.elastic.run``): the killed worker's node leaves, the 4 workers of the other two re-form in
  memory and go on from the last commit. torchrun: ``--nnodes 2:3 --rdzv-backend c10d
  --max-restarts 3`` with agent_steps.py, which restarts every worker and reloads the step from disk.

Each part also runs ``torchrun-own-store``: the same torchrun command with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, torch's opt-out from handing the workers the agents'
store, so that each rendezvous round's rank 0 worker serves a fresh store at a new port.

A run that does not finish within 180 s, fails, or shows no step after the kill, is counted in
``restarts_without_a_next_step`` (in the in-memory part, the agent of the killed worker's node
ends with that worker's status: expected). Medians over ``--repeats``, alternating the launchers.
On the simulated hosts torchrun 2.13's restarted workers fail in Gloo's connectFullMesh until its
restarts run out (workers of different attempts meet in the agents' one store, which has no
per-attempt prefix; benchmarks/RESULTS.md says more), so its kill-to-next-step is usually None;
``torchrun-own-store`` is the torchrun baseline whose restarts meet.
Writes benchmarks/results/cluster_agents.json. Targets: start-up <= 0.7x torchrun's; kill to next
step <= 0.5x torchrun's (``in_memory_kill_to_next_step_s``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import statistics
import subprocess
import sys
import time

from recording import record

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "agent_steps.py")
ELASTIC_WORKER = os.path.join(HERE, "agent_elastic_steps.py")
# torchrun as it starts by default, and with its workers on a store of their own per round
TORCHRUNS = {"torchrun": {}, "torchrun-own-store": {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}}
LAUNCHERS = ("accord", *TORCHRUNS)
KILL_STEP = 5  # the step (from 0) at whose start a worker SIGKILLs itself


def _free_port(cluster) -> int:
    code = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
    return int(cluster.run("h1", [sys.executable, "-c", code]).stdout)


def _launch(cluster, which: str, nnodes: str, ckpt: str, secret: str, extra: list[str],
            hosts: tuple[str, ...] = ("h1", "h2"), may_fail: tuple[int, ...] = (),
            in_memory: bool = False) -> tuple[float, list[str]] | None:
    """Start one agent per host; return (start time, every host's stdout), or None when the job
    did not finish within 180 s (its agents are killed) or an agent not in ``may_fail`` failed.
    ``in_memory``: accord's agents run benchmarks/agent_elastic_steps.py, without --max-restarts."""
    from cluster_common import ACCORDRUN, REPO, Cluster

    port = _free_port(cluster)
    procs = []
    started = time.time()
    for rank, host in enumerate(hosts):
        if which in TORCHRUNS:
            argv = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--nnodes", nnodes,
                    "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"h1:{port}",
                    "--max-restarts", "3", "--node-rank", str(rank)]
        else:
            argv = [ACCORDRUN, "--nnodes", nnodes, "--nproc-per-node", "2", "--rdzv-endpoint", f"h1:{port}",
                    "--secret-file", secret, "--node-rank", str(rank)] + ([] if in_memory else ["--max-restarts", "3"])
        # torchrun runs its script with its own Python; accordrun runs the command it is given
        if which in TORCHRUNS:
            argv += [WORKER, "--ckpt", ckpt, *extra]
        else:
            argv += [sys.executable, ELASTIC_WORKER, *extra] if in_memory else [sys.executable, WORKER, "--ckpt", ckpt,
                                                                               *extra]
        env = Cluster.env({"OMP_NUM_THREADS": "1", **TORCHRUNS.get(which, {})})
        procs.append(cluster.popen(host, argv, cwd=REPO, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    failed = False
    for index, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            # torchrun's workers outlive their killed agents (stuck in a collective): they hold
            # the output pipes, so everything left on the hosts goes first
            for host in hosts:
                for pid, _ in cluster.processes(host):
                    try:
                        os.kill(pid, 9)
                    except OSError:
                        pass
            for other in procs:
                other.communicate()
            print(f"{which} --nnodes {nnodes} {' '.join(extra)}: did not finish within 180 s", flush=True)
            return None
        if proc.returncode != 0 and index not in may_fail:  # a run without a result, with its last error line
            last = [line for line in err.splitlines() if line.strip()][-1:] or ["(no stderr)"]
            print(f"{which} --nnodes {nnodes} {' '.join(extra)}: exit {proc.returncode}: {last[0]}", flush=True)
            failed = True
        outs.append(out)
    if failed:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        return None
    return started, outs


def _stamp(outs: list[str], tag: str) -> float:
    for out in outs:
        found = re.findall(rf"{tag} ([0-9.]+)\s*$", out, flags=re.MULTILINE)
        if found:
            return float(found[0])
    raise SystemExit(f"no {tag} line in the output")


def _next_step(outs: list[str], kill_step: int) -> float | None:
    """The time of the first step after the kill: the first step the killed worker never joined
    (the ``kill_step``-th, counting from 0) done by the next attempt (a restart) or the re-formed
    job. Told by the steps done, not by the attempt number: a torchrun agent that restarts for a
    changed membership before it sees its own workers fail does not count a restart."""
    steps = [json.loads(m) for out in outs for m in re.findall(r"STEP (\{.*\})\s*$", out, flags=re.MULTILINE)]
    after = [s["t"] for s in steps if s["done"] > kill_step]
    return min(after) if after else None


def _kill_run(times: dict[str, list], key: str, run: tuple[float, list[str]] | None, i: int) -> None:
    """Record one kill-to-next-step run under ``key`` (a run without a next step by its repeat)."""
    after = _next_step(run[1], KILL_STEP) if run is not None else None
    if after is None:  # no step after the kill (or no end): recorded as missing
        times.setdefault(key.replace("kill_to_next_step_s", "restarts_without_a_next_step"), []).append(i)
    else:
        times[key].append(after - _stamp(run[1], "KILL"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--parts", default="startup,restart,in-memory",
                   help="comma-separated: startup, restart, in-memory (see the module docstring)")
    p.add_argument("--restart-nnodes", default="2",
                   help="--nnodes of the restart runs (the issue names 2:3; torchrun 2.13's c10d agents "
                        "did not finish a restart with 2:3 here within 10 minutes)")
    p.add_argument("--launchers", default=",".join(LAUNCHERS),
                   help=f"comma-separated, run in this order each repeat: {', '.join(LAUNCHERS)}")
    args = p.parse_args(argv)
    parts = set(args.parts.split(","))
    launchers = [w for w in args.launchers.split(",") if w]
    unknown = sorted(set(launchers) - set(LAUNCHERS))
    if unknown:
        p.error(f"--launchers: unknown {', '.join(unknown)} (known: {', '.join(LAUNCHERS)})")
    from cluster_common import load_average, start_cluster

    keys = ("startup_s", "kill_to_next_step_s", "in_memory_kill_to_next_step_s")
    times: dict[str, dict[str, list]] = {w: {k: [] for k in keys} for w in launchers}
    before = load_average()
    with start_cluster(hosts=3 if "in-memory" in parts else 2) as cluster:
        folder = os.path.join(cluster.shared, "bench")
        os.makedirs(folder, mode=0o777)
        secret = os.path.join(folder, "secret")
        with open(secret, "w") as fh:
            fh.write(secrets.token_hex(32))
        os.chmod(secret, 0o600)
        for i in range(args.repeats):
            for which in launchers:
                if "startup" in parts:
                    run = _launch(cluster, which, "2", os.path.join(folder, f"{which}-{i}-a"), secret,
                                  ["--steps", "2"])
                    if run is not None:  # (a start-up run that fails is left out, and printed)
                        times[which]["startup_s"].append(_stamp(run[1], "FIRST") - run[0])
                if "restart" in parts:
                    run = _launch(cluster, which, args.restart_nnodes, os.path.join(folder, f"{which}-{i}-b"),
                                  secret, ["--steps", "8", "--kill-step", str(KILL_STEP)])
                    _kill_run(times[which], "kill_to_next_step_s", run, i)
                if "in-memory" in parts:
                    # rank 3 is on h2 (node 1): accord's node 1 leaves, its agent ends with 137
                    run = _launch(cluster, which, "2:3", os.path.join(folder, f"{which}-{i}-c"), secret,
                                  ["--steps", "12", "--kill-step", str(KILL_STEP)], hosts=("h1", "h2", "h3"),
                                  may_fail=(1,) if which == "accord" else (), in_memory=which == "accord")
                    _kill_run(times[which], "in_memory_kill_to_next_step_s", run, i)
                print(which, {k: v[-1] if v else None for k, v in times[which].items()}, flush=True)
    medians = {w: {k: statistics.median(v) if v else None for k, v in t.items() if k.endswith("_s")}
               for w, t in times.items()}
    result = {"runs": times, "median": medians, "parts": sorted(parts),
              "layout": "startup/restart: 2 simulated hosts x 2 workers; in-memory: 3 hosts x 2 workers, "
                        "--nnodes 2:3; one agent per host", "load_before": before, "load_after": load_average()}
    m = result["median"]
    for baseline in [w for w in launchers if w in TORCHRUNS and "accord" in launchers]:
        result[f"ratio_accord_over_{baseline.replace('-', '_')}"] = {
            k: m["accord"][k] / m[baseline][k] for k in m["accord"] if m["accord"][k] and m[baseline][k]}
    print(json.dumps(result["median"], indent=1))
    for key in [k for k in result if k.startswith("ratio_")]:
        print(f"{key}:", result[key])
    record(result, os.path.join(HERE, "results", "cluster_agents.json"), "cluster_agents.py", argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
