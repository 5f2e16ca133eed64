"""Hierarchical allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE) against flat Gloo, side by side.

    python benchmarks/hierarchical_allreduce.py [--iters 10] [--warmup 2]

Four ranks on this machine posing as two hosts of two ranks (ACCORD_HOSTNAME host0/host1), so
the job takes the multi-host path: the flat communicator is Gloo over all four ranks, the
hierarchical one reduce-scatters within each "host" over shared memory, allreduces each half
across the hosts over Gloo, and allgathers within the host. Both are timed on the same ranks in
one run, alternating every iteration, for 1 MB, 16 MB and 64 MB of float32.

Caveat: the "network" here is loopback TCP on one 2-core machine running four ranks, not a
real network; the ratio shows what the three steps cost against one flat Gloo allreduce when
the data crossing hosts halves, not what a cluster would see. Writes
benchmarks/results/hierarchical_allreduce.json with the command that produced it.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

from fake_hosts import pose_as_hosts
from recording import record

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "hierarchical_allreduce.json")
SIZES = [1024 ** 2, 16 * 1024 ** 2, 64 * 1024 ** 2]


def _worker(iters: int, warmup: int) -> dict:
    import torch
    import torch.distributed as dist

    from accord import config
    from accord.comm import ReduceOp
    from accord.comm.backend import get_backend
    from accord.comm.hierarchical import HierarchicalCommunicator
    from accord.engine import session

    torch.set_num_threads(1)
    rank = int(config.get("ACCORD_RANK"))
    pose_as_hosts(rank)
    session.init()
    from accord.bench.strategies import start_baseline_group, stop_baseline_group

    baseline = start_baseline_group()  # the raw torch.distributed baseline's default group
    # communicators of our own, built as the engine builds them (every rank creates every group,
    # in the same order): the engine's own local one carries its host-first negotiations
    hosts = [[0, 1], [2, 3]]
    gloo, shm = get_backend("gloo"), get_backend("shm")
    flat = gloo.create([0, 1, 2, 3])
    local = [c for c in (shm.create(r) for r in hosts) if c is not None][0]
    cross = [c for c in (gloo.create(list(r)) for r in zip(*hosts)) if c is not None][0]
    comms = {"flat_gloo": flat, "hierarchical": HierarchicalCommunicator(flat, local, cross)}
    for name, comm in comms.items():  # correct before fast
        check = torch.full((1001,), float(rank + 1))
        comm.allreduce(check, ReduceOp.SUM)
        assert check.eq(10.0).all(), f"{name} allreduce is wrong: {check[:4].tolist()}"
    samples: dict[str, dict[int, list[float]]] = {n: {s: [] for s in SIZES} for n in comms}
    for size in SIZES:
        t = torch.ones(size // 4)
        for it in range(warmup + iters):
            order = list(comms) if it % 2 == 0 else list(reversed(comms))
            for name in order:
                dist.barrier()
                start = time.perf_counter()
                comms[name].allreduce(t, ReduceOp.SUM)
                if it >= warmup:
                    samples[name][size].append(time.perf_counter() - start)
    stop_baseline_group(baseline)
    session.shutdown()
    if rank != 0:
        return {}
    table = {}
    for size in SIZES:
        med = {n: statistics.median(samples[n][size]) for n in comms}
        table[str(size)] = {"flat_gloo_ms": round(med["flat_gloo"] * 1e3, 2),
                            "hierarchical_ms": round(med["hierarchical"] * 1e3, 2),
                            "speedup": round(med["flat_gloo"] / med["hierarchical"], 2)}
    return {"sizes": table, "environment": {
        "torch": torch.__version__, "python": platform.python_version(), "ranks": 4,
        "layout": "2 fake hosts x 2 ranks on one machine", "cpus": os.cpu_count(),
        "iterations": iters, "warmup": warmup}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    from accord.run.functions.spawn import spawn

    result = spawn(_worker, args=(args.iters, args.warmup), nprocs=4)[0]
    record(result, RESULTS, "hierarchical_allreduce.py", argv)
    print(f"{'size':>10}  {'flat gloo ms':>12}  {'hierarchical ms':>15}  speed-up")
    for size, row in result["sizes"].items():
        print(f"{int(size) // 1024:>8}KB  {row['flat_gloo_ms']:>12.2f}  "
              f"{row['hierarchical_ms']:>15.2f}  {row['speedup']:.2f}x")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
