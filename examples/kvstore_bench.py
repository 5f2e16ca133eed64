"""Push+pull throughput of a parameter-server KVStore: one big float32 key per round.

    python examples/kvstore_bench.py --mb 100 --servers 2 --workers 2 --rounds 10
    python examples/kvstore_bench.py --mxnet-python .venv-mxnet/bin/python   (built by scripts/setup_env.sh)

Starts the servers (LocalCluster) and the workers itself. Each worker runs warm-up rounds, then
measured rounds of ``push(key, grad); pull(key, out=weight)`` between barriers, and rank 0
prints rounds/s and GB/s, counting the bytes each worker pushes and pulls (2 x MB per round).
With ``--mxnet-python`` the same workload then runs on MXNet's own dist_sync (scheduler, servers
and workers started by ``accordrun --ps mxnet``, loopback) in the same run, and the ratio is printed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from accord import config


def worker(mb: float, rounds: int, warmup: int, kind: str) -> None:
    import torch

    import accord.kvstore as kvs

    torch.set_num_threads(1)
    n = int(mb * 1024 * 1024 / 4)
    kv = kvs.create(kind)
    grad, weight = torch.ones(n), torch.zeros(n)
    kv.init(0, weight)
    times = []
    for i in range(warmup + rounds):
        kv.barrier()
        start = time.perf_counter()
        kv.push(0, grad)
        kv.pull(0, out=weight)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    kv.close()
    if kv.rank == 0:
        mean = statistics.mean(times)
        sd = statistics.stdev(times) if len(times) > 1 else 0.0
        print(json.dumps({"kvstore": kind, "workers": kv.num_workers, "MB": mb,
                          "round_ms": round(mean * 1e3, 1), "ci95_ms": round(1.96 * sd * 1e3, 1),
                          "rounds_per_s": round(1 / mean, 2),
                          "GB_per_s_per_worker": round(2 * mb / 1024 / mean, 3)}), flush=True)


MXNET_WORKER = """
import json, statistics, sys, time
import mxnet as mx
mb, rounds, warmup = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
kv = mx.kv.create("dist_sync")
n = int(mb * 1024 * 1024 / 4)
grad, weight = mx.nd.ones(n), mx.nd.zeros(n)
kv.init(0, weight)
times = []
for i in range(warmup + rounds):
    kv._barrier()
    start = time.perf_counter()
    kv.push(0, grad)
    kv.pull(0, out=weight)
    weight.wait_to_read()
    if i >= warmup:
        times.append(time.perf_counter() - start)
if kv.rank == 0:
    mean = statistics.mean(times)
    print(json.dumps({"kvstore": "mxnet dist_sync", "workers": kv.num_workers, "MB": mb,
                      "round_ms": round(mean * 1e3, 1), "rounds_per_s": round(1 / mean, 2),
                      "GB_per_s_per_worker": round(2 * mb / 1024 / mean, 3)}), flush=True)
"""


def run_mxnet(python: str, args: argparse.Namespace) -> dict:
    """MXNet 1.9.1's dist_sync on the same workload: its own scheduler, servers and workers,
    started by ``accordrun --ps mxnet`` (DMLC_* roles on loopback) from that Python."""
    cmd = [python, "-m", "accord.run", "-np", str(args.workers), "--ps", "mxnet",
           "--num-servers", str(args.servers), python, "-c", MXNET_WORKER,
           str(args.mb), str(args.rounds), str(args.warmup)]
    env = {**config.snapshot(), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    lines = [ln.split(":", 1)[1] for ln in proc.stdout.splitlines() if '"kvstore": "mxnet' in ln]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"MXNet's dist_sync failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    print(lines[-1].strip(), flush=True)
    return json.loads(lines[-1])


def run_accord(args: argparse.Namespace) -> dict:
    from accord.kvstore.cluster import LocalCluster

    with LocalCluster(args.servers, args.workers) as cluster:
        argv = [sys.executable, __file__, "--worker", "--mb", str(args.mb), "--rounds", str(args.rounds),
                "--warmup", str(args.warmup), "--kvstore", args.kvstore]
        procs = [subprocess.Popen(argv, env={**config.snapshot(), **cluster.worker_env(r), "OMP_NUM_THREADS": "1"},
                                  stdout=subprocess.PIPE, text=True)
                 for r in range(args.workers)]
        out = "".join(p.communicate()[0] for p in procs)
    print(out.strip(), flush=True)
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--kvstore", default="dist_sync")
    parser.add_argument("--mxnet-python", help="a Python with mxnet 1.9.1: also run MXNet's dist_sync")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.mb, args.rounds, args.warmup, args.kvstore)
        return 0
    ours = run_accord(args)
    if args.mxnet_python:
        theirs = run_mxnet(args.mxnet_python, args)
        print(f"accord / MXNet rounds per second: {ours['rounds_per_s'] / theirs['rounds_per_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
