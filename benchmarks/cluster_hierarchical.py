"""Hierarchical against flat allreduce across simulated hosts, by link speed, side by side.

    python benchmarks/cluster_hierarchical.py [--rates 1gbit,10gbit,unlimited] [--iters 5]

Two simulated hosts x two ranks (network namespaces with their own sshd, tools/simcluster),
started with accordrun over ssh from h1. For each link rate (tbf on both ends of every link)
one job times, on the same ranks and alternating every iteration, Gloo's flat allreduce over
all four ranks and accord's hierarchical one (reduce-scatter over shared memory within the host,
allreduce of each half across hosts over Gloo, broadcasts within the host), from 16 KB to 256 MB
of float32. Flat sends 1.5x the buffer out of each host, hierarchical 1.0x: 1.5x is the limit of
the gain where the link is the bottleneck. The small sizes give ACCORD_HIERARCHICAL_MIN_BYTES
(below it the automatic choice runs flat). Writes benchmarks/results/cluster_hierarchical.json.

Caveat: the four ranks share this machine's cores (2 here) with the simulated network, so
"unlimited" links are bounded by CPU, not by a NIC.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from recording import record

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "cluster_hierarchical.json")
KB, MB = 1024, 1024 * 1024
SIZES = [16 * KB, 64 * KB, 256 * KB, 1 * MB, 4 * MB, 16 * MB, 64 * MB, 256 * MB]


def worker(iters: int, warmup: int, max_bytes: int, pieces: list[int]) -> None:
    """One rank: time flat and hierarchical allreduce on every size; rank 0 prints RESULT."""
    import torch
    import torch.distributed as dist

    import accord.torch as hvd
    from accord.comm import ReduceOp
    from accord.comm.backend import get_backend
    from accord.comm.hierarchical import HierarchicalCommunicator

    torch.set_num_threads(1)
    hvd.init()
    from accord.bench.strategies import start_baseline_group, stop_baseline_group

    baseline = start_baseline_group()  # the raw torch.distributed baseline's default group
    # communicators of our own (the engine's are busy with its idle negotiations), built as the
    # engine builds them: every rank creates every group, in the same order, keeps its own
    size, local_size = hvd.size(), hvd.local_size()
    hosts = [list(range(h, h + local_size)) for h in range(0, size, local_size)]
    gloo, shm = get_backend("gloo"), get_backend("shm")
    flat = gloo.create(list(range(size)))
    local = [c for c in (shm.create(r) for r in hosts) if c is not None][0]
    cross = [c for c in (gloo.create(list(r)) for r in zip(*hosts)) if c is not None][0]
    comms = {"flat": flat, "hierarchical": HierarchicalCommunicator(flat, local, cross)}
    for piece in pieces:  # other pipeline piece sizes, side by side with the default (0: none)
        comms[f"hierarchical_piece_{piece // KB}KB"] = HierarchicalCommunicator(flat, local, cross)
        comms[f"hierarchical_piece_{piece // KB}KB"].piece_bytes = piece or 1 << 62
    for name, comm in comms.items():  # correct before fast
        check = torch.full((1001,), float(hvd.rank() + 1))
        comm.allreduce(check, ReduceOp.SUM)
        assert check.eq(10.0).all(), f"{name} allreduce is wrong: {check[:4].tolist()}"
    table = {}
    for size in [s for s in SIZES if s <= max_bytes]:
        t = torch.ones(size // 4)
        samples: dict[str, list[float]] = {n: [] for n in comms}
        reps = iters if size >= MB else iters * 4  # small sizes are cheap and noisier
        for it in range(warmup + reps):
            for name in (list(comms) if it % 2 == 0 else list(reversed(comms))):
                dist.barrier()
                start = time.perf_counter()
                comms[name].allreduce(t, ReduceOp.SUM)
                if it >= warmup:
                    samples[name].append(time.perf_counter() - start)
        med = {n: statistics.median(v) for n, v in samples.items()}
        table[str(size)] = {"flat_ms": round(med["flat"] * 1e3, 3),
                            "hierarchical_ms": round(med["hierarchical"] * 1e3, 3),
                            "speedup": round(med["flat"] / med["hierarchical"], 3),
                            "flat_GBps": round(size / med["flat"] / 1e9, 3)}
        for name in comms:
            if name.startswith("hierarchical_piece"):
                table[str(size)][f"{name}_speedup"] = round(med["flat"] / med[name], 3)
    if hvd.rank() == 0:
        print("RESULT " + json.dumps({"sizes": table, "torch": torch.__version__}), flush=True)
    stop_baseline_group(baseline)
    hvd.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", default="1gbit,10gbit,unlimited")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--max-mb", type=int, default=256)
    p.add_argument("--pieces", default="", help="also time these pipeline piece sizes in KB (0: not "
                   "pipelined), e.g. 0,2048,8192")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.iters, args.warmup, args.max_mb * MB, [int(k) * KB for k in args.pieces.split(",") if k])
        return 0
    from cluster_common import load_average, run_job, start_cluster

    result = {"layout": "2 simulated hosts x 2 ranks (accordrun over ssh)", "cpus": os.cpu_count(),
              "load_before": load_average(), "rates": {}}
    with start_cluster(hosts=2) as cluster:
        for rate in args.rates.split(","):
            cluster.set_rate(None if rate == "unlimited" else rate)
            job = run_job(cluster, ["-H", "h1:2,h2:2", sys.executable, os.path.abspath(__file__), "--worker",
                                    "--iters", str(args.iters), "--warmup", str(args.warmup),
                                    "--max-mb", str(args.max_mb), "--pieces", args.pieces])
            result["rates"][rate] = job["sizes"]
            print(f"links {rate}:")
            print(f"{'size':>10}  {'flat ms':>10}  {'hierarchical ms':>15}  speed-up")
            for size, row in job["sizes"].items():
                others = "  ".join(f"{k[len('hierarchical_piece_'):-len('_speedup')]}: {v:.2f}x"
                                   for k, v in row.items() if k.endswith("_speedup"))
                print(f"{int(size) // KB:>8}KB  {row['flat_ms']:>10.2f}  {row['hierarchical_ms']:>15.2f}  "
                      f"{row['speedup']:.2f}x  {others}", flush=True)
    result["load_after"] = load_average()
    record(result, RESULTS, "cluster_hierarchical.py", argv)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
