"""KVStore push+pull across simulated hosts: accord's parameter servers against MXNet 1.9.1's.

    python benchmarks/cluster_kvstore.py --mxnet-python .venv-mxnet/bin/python [--rate 1gbit]

Two simulated hosts (tools/simcluster), links at ``--rate``; on each host one worker and one
server (accordrun --num-servers 2 spreads them; MXNet's scheduler runs on h1 as its launcher
would put it). The workload is examples/kvstore_bench.py's: one 100 MB float32 key, warm-up
rounds, then measured rounds of push + pull between barriers; rank 0 reports the mean round.
MXNet runs in its own venv (``mxnet==1.9.1 numpy==1.23.5``; see docs/simulated-cluster.md),
started with DMLC_* variables on the same hosts, in the same run. Target: >= 1.5x.
The same run also measures the link's floor (link_floor.py: plain TCP swapping the round's cross-host
bytes, --mb MiB each way) and reports how close each framework comes to it, and the best ratio
over MXNet any framework could reach on these links (MXNet's round over the floor).
Writes benchmarks/results/cluster_kvstore.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import link_floor
from recording import record

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results", "cluster_kvstore.json")
BENCH = os.path.join(REPO, "examples", "kvstore_bench.py")


def _last_json(text: str) -> dict:
    found = re.findall(r"(\{\"kvstore\".*\})\s*$", text, flags=re.MULTILINE)
    if not found:
        sys.exit(f"no result in:\n{text[-3000:]}")
    return json.loads(found[-1])


def run_accord(cluster, args: argparse.Namespace) -> dict:
    from cluster_common import ACCORDRUN

    res = cluster.run("h1", [ACCORDRUN, "-H", "h1:1,h2:1", "--num-servers", "2", sys.executable, BENCH,
                             "--worker", "--mb", str(args.mb), "--rounds", str(args.rounds),
                             "--warmup", str(args.warmup), "--kvstore", "dist_sync"],
                      timeout=1800, cwd=REPO, env=cluster.env({"OMP_NUM_THREADS": "1"}))
    if res.returncode != 0:
        sys.exit(f"accord job failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    return _last_json(res.stdout)


def run_mxnet(cluster, python: str, args: argparse.Namespace) -> dict:
    sys.path.insert(0, os.path.dirname(BENCH))
    from kvstore_bench import MXNET_WORKER

    root = cluster.hosts["h1"].address
    base = {"DMLC_PS_ROOT_URI": root, "DMLC_PS_ROOT_PORT": "9091", "DMLC_NUM_SERVER": "2",
            "DMLC_NUM_WORKER": "2", "DMLC_INTERFACE": "eth0", "OMP_NUM_THREADS": "1"}
    serve = [python, "-c", "import mxnet"]  # schedulers and servers serve from the import

    def env(host: str, role: str) -> dict[str, str]:
        return cluster.env({**base, "DMLC_ROLE": role, "DMLC_NODE_HOST": cluster.hosts[host].address})

    procs = [cluster.popen("h1", serve, env=env("h1", "scheduler"), cwd=REPO)]
    procs += [cluster.popen(h, serve, env=env(h, "server"), cwd=REPO) for h in ("h1", "h2")]
    workers = [cluster.popen(h, [python, "-c", MXNET_WORKER, str(args.mb), str(args.rounds), str(args.warmup)],
                             env=env(h, "worker"), cwd=REPO, stdout=subprocess.PIPE, text=True)
               for h in ("h1", "h2")]
    try:
        out = "".join(w.communicate(timeout=1800)[0] for w in workers)
    finally:
        for p in procs + workers:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return _last_json(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mxnet-python", help="a Python with mxnet 1.9.1 (without it: accord only)")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--mb", type=float, default=100.0)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)
    from cluster_common import load_average, start_cluster

    result = {"layout": "2 simulated hosts, 1 worker + 1 server on each", "rate": args.rate,
              "load_before": load_average()}
    with start_cluster(hosts=2, rate=None if args.rate == "unlimited" else args.rate) as cluster:
        result["link_floor"] = link_floor.measure(cluster, args.mb)
        print("link floor:", result["link_floor"], flush=True)
        floor_ms = result["link_floor"]["median_ms"]
        result["accord"] = run_accord(cluster, args)
        result["accord_floor_over_round"] = round(floor_ms / result["accord"]["round_ms"], 3)
        print("accord:", result["accord"], flush=True)
        if args.mxnet_python:
            result["mxnet"] = run_mxnet(cluster, os.path.abspath(args.mxnet_python), args)
            print("mxnet:", result["mxnet"], flush=True)
            result["accord_over_mxnet"] = round(result["accord"]["rounds_per_s"] / result["mxnet"]["rounds_per_s"], 3)
            result["mxnet_floor_over_round"] = round(floor_ms / result["mxnet"]["round_ms"], 3)
            result["best_possible_over_mxnet"] = round(result["mxnet"]["round_ms"] / floor_ms, 3)
            print(f"accord / MXNet rounds per second: {result['accord_over_mxnet']:.2f}x (at most "
                  f"{result['best_possible_over_mxnet']:.2f}x on these links: MXNet's round over the floor)")
    result["load_after"] = load_average()
    record(result, RESULTS, "cluster_kvstore.py", argv)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
