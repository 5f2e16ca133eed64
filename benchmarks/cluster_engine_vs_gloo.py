"""accord's engine (hvd.allreduce, Gloo path) against raw Gloo across simulated hosts.

    python benchmarks/cluster_engine_vs_gloo.py [--rate 1gbit] [--iters 50]

Two simulated hosts x two ranks (tools/simcluster), accordrun over ssh, links at ``--rate``. In
one job, alternating, on the same ranks:

- a lone 1 KB synchronous allreduce: ``hvd.allreduce`` (negotiation + collective) against
  ``torch.distributed.all_reduce`` on a Gloo group of the same ranks;
- 160 x 100 KB (gradients of a step): ``hvd.allreduce_async_`` x 160 in place, as
  DistributedOptimizer reduces gradients, then synchronize (fused, hierarchical when chosen
  automatically) against ONE raw flat allreduce of the same 16 MB; and the same out of place
  (``hvd.allreduce_async``: 160 result tensors are allocated and filled);
- 64 MB: ``hvd.allreduce`` against one raw allreduce (bandwidth).

Before each timed call the ranks meet in a barrier on a group of their own, used by neither
side: a Gloo group whose own barrier has just returned runs a small allreduce faster (measured
here, 2 hosts x 2 ranks, 1 KB: 5.7-6.1 ms right after a barrier on the same group, 6.4-6.5 ms
after one on another group), which would favour the raw side. ``raw_hot_ms`` keeps that
figure for the lone case, and ``engine_split_ms`` rank 0's medians of the engine's time before,
in and after its own Gloo allreduce (what the engine adds, apart from the collective's spread).

Targets: lone 1 KB <= 1.3x raw; 160 x 100 KB <= 1.0x; 64 MB >= 0.95x raw bandwidth.
Writes benchmarks/results/cluster_engine_vs_gloo.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from recording import record

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "cluster_engine_vs_gloo.json")


def worker(iters: int) -> None:
    """One rank: time each case against its raw baseline; rank 0 prints RESULT."""
    import torch
    import torch.distributed as dist

    import accord.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    from accord.bench.strategies import start_baseline_group, stop_baseline_group

    baseline = start_baseline_group()  # the raw torch.distributed baseline's default group
    raw = dist.new_group(backend="gloo")  # the same ranks, outside the engine
    meet = dist.new_group(backend="gloo")  # the barrier before each timed call (see the module)
    lone = torch.ones(256)
    grads = [torch.ones(25600) for _ in range(160)]
    flat16 = torch.ones(160 * 25600)
    big = torch.ones(16 * 1024 * 1024)

    inner = _time_inner_allreduces()

    def engine_lone() -> None:
        start = time.perf_counter()
        hvd.allreduce(lone, name="lone", op=hvd.Sum)
        end = time.perf_counter()
        if inner and inner[-1][0] >= start:  # where the time went: before, in, after its Gloo call
            a, b = inner[-1]
            split.append((a - start, b - a, end - b))

    def engine_grads() -> None:
        handles = [hvd.allreduce_async_(g, name=f"grad.{i}", op=hvd.Sum) for i, g in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)

    def engine_grads_out_of_place() -> None:
        handles = [hvd.allreduce_async(g, name=f"grad.{i}", op=hvd.Sum) for i, g in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)

    def raw_hot() -> None:
        dist.barrier(group=raw)  # in the timed call's stead: the raw group's own barrier first
        start = time.perf_counter()
        dist.all_reduce(lone, group=raw)
        hot.append(time.perf_counter() - start)

    def engine_big() -> None:
        hvd.allreduce(big, name="big", op=hvd.Sum)

    cases = {
        "lone_1KB": (engine_lone, lambda: dist.all_reduce(lone, group=raw), iters),
        "grads_160x100KB": (engine_grads, lambda: dist.all_reduce(flat16, group=raw), max(3, iters // 10)),
        "grads_160x100KB_out_of_place": (engine_grads_out_of_place, lambda: dist.all_reduce(flat16, group=raw),
                                         max(3, iters // 10)),
        "allreduce_64MB": (engine_big, lambda: dist.all_reduce(big, group=raw), max(3, iters // 20)),
    }
    table = {}
    hot: list[float] = []
    split: list[tuple[float, float, float]] = []
    for name, (ours, theirs, reps) in cases.items():
        times: dict[str, list[float]] = {"engine": [], "raw": []}
        for it in range(reps + 2):
            pair = (("engine", ours), ("raw", theirs))
            for label, fn in pair if it % 2 == 0 else pair[::-1]:
                dist.barrier(group=meet)
                start = time.perf_counter()
                fn()
                if it >= 2:
                    times[label].append(time.perf_counter() - start)
            if name == "lone_1KB" and it >= 2:
                raw_hot()
        med = {k: statistics.median(v) for k, v in times.items()}
        table[name] = {"engine_ms": round(med["engine"] * 1e3, 3), "raw_ms": round(med["raw"] * 1e3, 3),
                       "engine_over_raw": round(med["engine"] / med["raw"], 3), "samples": reps}
        if name == "lone_1KB":
            table[name]["raw_hot_ms"] = round(statistics.median(hot) * 1e3, 3)
            if split:  # this rank's medians (rank 0 reports)
                parts = list(zip(*split[-reps:]))
                table[name]["engine_split_ms"] = {k: round(statistics.median(v) * 1e3, 3) for k, v in
                                                  zip(("before_collective", "collective", "after_collective"), parts)}
    if hvd.rank() == 0:
        print("RESULT " + json.dumps({"cases": table, "torch": torch.__version__,
                                      "engine_allreduce": _engine_path()}), flush=True)
    stop_baseline_group(baseline)
    hvd.shutdown()


def _time_inner_allreduces() -> list[tuple[float, float]]:
    """Record (start, end) of each allreduce the engine's flat Gloo communicator runs (the lone
    case's split); empty if the session's internals moved."""
    times: list[tuple[float, float]] = []
    try:
        from accord.engine import session

        comm = session.communicator(0, "cpu")
        flat = getattr(comm, "flat", comm)
        plain = flat.allreduce
    except Exception:  # noqa: BLE001 - a report detail
        return times

    def timed(tensor, op):
        start = time.perf_counter()
        plain(tensor, op)
        times.append((start, time.perf_counter()))

    flat.allreduce = timed
    return times


def _engine_path() -> str:
    """Which communicator the engine allreduced with, and how often hierarchically."""
    try:
        from accord.engine import session

        comm = session.communicator(0, "cpu")
    except Exception as exc:  # the session's internals moved
        return f"unknown ({exc})"
    chooser = getattr(comm, "chooser", None)
    kept = f", kept: {chooser.choice}" if chooser is not None else ""
    if chooser is not None and hasattr(chooser, "timings_ms"):
        kept += f", timed (ms): {chooser.timings_ms()}"
    try:
        stats = session._current().engine.stats()
        kept += (f"; engine: {stats.get('lent_cycles')} of {stats.get('planned_cycles')} planned cycles run by "
                 f"the caller, {stats.get('cycles')} cycles")
    except Exception:  # noqa: BLE001 - a report detail
        pass
    return f"{type(comm).__name__} ({getattr(comm, 'hierarchical_allreduces', 0)} hierarchical{kept})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.iters)
        return 0
    from cluster_common import load_average, run_job, start_cluster

    result = {"layout": "2 simulated hosts x 2 ranks (accordrun over ssh)", "rate": args.rate,
              "cpus": os.cpu_count(), "load_before": load_average()}
    with start_cluster(hosts=2, rate=None if args.rate == "unlimited" else args.rate) as cluster:
        job = run_job(cluster, ["-H", "h1:2,h2:2", sys.executable, os.path.abspath(__file__), "--worker",
                                "--iters", str(args.iters)])
    result.update(job)
    result["load_after"] = load_average()
    record(result, RESULTS, "cluster_engine_vs_gloo.py", argv)
    for name, row in job["cases"].items():
        print(f"{name:>16}: engine {row['engine_ms']:.2f} ms, raw {row['raw_ms']:.2f} ms, "
              f"{row['engine_over_raw']:.2f}x")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
