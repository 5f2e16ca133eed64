"""A step's gradients submitted one by one, against one pre-flattened allreduce, on shm, same run.

    python benchmarks/async_gradients_shm.py [--nprocs 2] [--iters 15] [--warmup 3] [--op sum|average]
                                             [--out PATH]

Every rank holds 160 separately allocated float32 tensors of 100 KB (16 MB in all) and one flat
16 MB tensor. Cases, timed per sample between barriers, taking turns (the order reverses every
iteration, so machine noise hits them alike); medians of the slowest rank:

- ``comm_flat``: the yardstick, one allreduce of the flat tensor on a shm communicator of the
  engine's settings built beside the engine (the engine's own idle work cannot touch it);
- ``engine_flat``: the same flat tensor through the engine (``hvd.allreduce_``), in rounds of
  its own with ``comm_flat`` after the others (between the 160 it would change the step that
  the engine sees repeat and plans, which a training loop does not);
- ``hvd_async_160``: ``hvd.allreduce_async_`` on each of the 160 tensors, then
  ``hvd.synchronize`` on every handle (what a training step's backward hooks and
  ``optimizer.step()`` do); ``submitted_160`` is the part of it until the last submission
  returned, on the same samples;
- ``comm_many_160``: the communicator alone reducing the 160 tensors as one op
  (``allreduce_many``, what the engine runs for them): the data path without the engine.

Reports ``hvd_async_160 / comm_flat`` (issue #37's target: <= 1.0 at 2 ranks) and the other
ratios. Writes benchmarks/results/async_gradients_shm[_average][_<n>ranks].json with the command.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable

from recording import record

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "async_gradients_shm.json")
TENSORS, ELEMENTS = 160, 25_600  # 100 KB of float32 each


def _worker(iters: int, warmup: int, op_name: str) -> dict:
    import torch
    import torch.distributed as dist

    import accord.torch as hvd
    from accord.bench.strategies import start_baseline_group, stop_baseline_group
    from accord.comm import ReduceOp
    from accord.comm.shm.backend import ShmBackend
    from accord.engine import session

    torch.set_num_threads(1)
    load_before = os.getloadavg()
    hvd.init()
    baseline = start_baseline_group()  # the barriers between samples
    rank, size = dist.get_rank(), dist.get_world_size()
    comm = session.build_communicator(ShmBackend(), range(size))
    op = hvd.Sum if op_name == "sum" else hvd.Average
    comm_op = ReduceOp.SUM if op_name == "sum" else ReduceOp.AVERAGE
    grads = [torch.ones(ELEMENTS) for _ in range(TENSORS)]
    flat = torch.ones(ELEMENTS * TENSORS)
    submitted: list[float] = []

    def hvd_async() -> None:
        start = time.perf_counter()
        handles = [hvd.allreduce_async_(g, name=f"grad.{i}", op=op) for i, g in enumerate(grads)]
        submitted.append(time.perf_counter() - start)
        for h in handles:
            hvd.synchronize(h)

    cases: dict[str, Callable[[], Any]] = {
        "comm_flat": lambda: comm.allreduce(flat, comm_op),
        "hvd_async_160": hvd_async,
    }
    if op_name == "sum":  # (allreduce_many has no Average: the engine sums, then scales)
        cases["comm_many_160"] = lambda: comm.allreduce_many(grads, grads, ReduceOp.SUM)
    samples: dict[str, list[float]] = {k: [] for k in cases}
    submitted_kept: list[float] = []

    def measure(names: list[str], rounds: int) -> None:
        for it in range(rounds):
            for name in names if it % 2 == 0 else reversed(names):
                dist.barrier()
                start = time.perf_counter()
                cases[name]()
                elapsed = time.perf_counter() - start
                if it >= warmup:
                    samples[name].append(elapsed)
                    if name == "hvd_async_160":
                        submitted_kept.append(submitted[-1])

    # The engine's requests between the 160 would change the repeated step the engine plans
    # (a training loop submits only its gradients), so the flat request gets its own rounds.
    measure(list(cases), warmup + iters)
    stats = session.engine().stats()
    cases["engine_flat"] = lambda: hvd.allreduce_(flat, name="flat", op=op)
    samples["engine_flat"] = []
    measure(["comm_flat", "engine_flat"], warmup + iters)
    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    med["submitted_160"] = statistics.median(submitted_kept) * 1e3
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, med)
    comm.close()
    stop_baseline_group(baseline)
    hvd.shutdown()
    if rank != 0:
        return {}
    worst = {k: max(g[k] for g in gathered) for k in med}
    ratios = {"hvd_async_160_x_comm_flat": worst["hvd_async_160"] / worst["comm_flat"],
              "hvd_async_160_x_engine_flat": worst["hvd_async_160"] / worst["engine_flat"],
              "engine_flat_x_comm_flat": worst["engine_flat"] / worst["comm_flat"],
              "submitted_160_x_comm_flat": worst["submitted_160"] / worst["comm_flat"]}
    if "comm_many_160" in worst:
        ratios["comm_many_160_x_comm_flat"] = worst["comm_many_160"] / worst["comm_flat"]
    return {
        "median_ms_slowest_rank": {k: round(v, 3) for k, v in worst.items()},
        "median_ms_per_rank": [{k: round(v, 3) for k, v in g.items()} for g in gathered],
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "engine_stats_rank0": stats,
        "environment": {
            "torch": torch.__version__, "python": platform.python_version(), "world_size": size,
            "cpus": os.cpu_count(), "threads_per_rank": 1, "iterations": iters, "warmup": warmup,
            "op": op_name, "tensors": TENSORS, "tensor_bytes": ELEMENTS * 4,
            "load_before_after": [list(load_before), list(os.getloadavg())]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--op", choices=("sum", "average"), default="sum")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from accord.run.functions.spawn import spawn

    os.environ["ACCORD_CPU_BACKEND"] = "shm"  # inherited by the spawned ranks
    suffix = ("" if args.op == "sum" else f"_{args.op}") + ("" if args.nprocs == 2 else f"_{args.nprocs}ranks")
    out = args.out or RESULTS.replace(".json", f"{suffix}.json")
    result = spawn(_worker, args=(args.iters, args.warmup, args.op), nprocs=args.nprocs)[0]
    record(result, out, "async_gradients_shm.py", argv)
    print(f"{args.nprocs} ranks, {os.cpu_count()} cpus, op {args.op}; median ms of the slowest rank")
    for name, value in result["median_ms_slowest_rank"].items():
        print(f"  {name:>14}: {value:8.2f}")
    for name, value in result["ratios"].items():
        print(f"  {name}: {value}")
    print(f"load {result['environment']['load_before_after']}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
