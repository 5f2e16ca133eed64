"""The engine on the multi-host path against raw Gloo, 4 ranks posing as 2 hosts x 2 ranks.

    python benchmarks/negotiation_hosts.py [--iters 20] [--out FILE]

Hosts are faked with ACCORD_HOSTNAME (host0, host1) and ACCORD_HIERARCHICAL_ALLREDUCE=1, so the
engine takes the path of a job spanning hosts: Gloo across "hosts", shared memory within one,
and its per-cycle negotiation host-first (see accord/comm/host_first.py). Alternating on the
same ranks, medians after warm-up:

1. a lone 1 KB synchronous allreduce through the engine vs ``dist.all_reduce`` on a Gloo group
   of the four ranks (target on a real cluster: <= 1.3x);
2. 160 x 100 KB submitted async, then synchronized, vs one raw flat allreduce of 16 MB (<= 1.0x);
3. 64 MB through the engine vs raw (>= 0.95x bandwidth).

What this cannot show: loopback has no link latency and the four ranks share two cores, so a
collective costs CPU time here, not round trips. The negotiation's share of a lone op on a real
network (one cross-host exchange among 2 ranks instead of a flat 4-rank allreduce) is smaller
than here. Compare two trees with PYTHONPATH=<tree>/src, alternating in one session.
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

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "negotiation_hosts.json")


def _worker(iters: int, warmup: int) -> dict:
    import torch
    import torch.distributed as dist

    import accord
    from accord import config
    from accord.engine import session

    torch.set_num_threads(1)
    rank = int(config.get("ACCORD_RANK"))
    pose_as_hosts(rank)
    session.init()
    from accord.bench.strategies import start_baseline_group, stop_baseline_group

    baseline = start_baseline_group()  # the raw torch.distributed baseline's default group
    raw = dist.new_group(backend="gloo")
    tiny, big = torch.ones(256), torch.ones(16 * 1024 * 1024)
    smalls = [torch.ones(25_600) for _ in range(160)]
    flat = torch.ones(25_600 * 160)

    def engine_many() -> None:
        hs = [session.submit("allreduce", t, f"g.{i:03d}", in_place=True) for i, t in enumerate(smalls)]
        for h in hs:
            session.synchronize(h)

    cases = {
        "raw_1KB": lambda: dist.all_reduce(tiny, group=raw),
        "engine_1KB": lambda: session.synchronize(session.submit("allreduce", tiny, "tiny", in_place=True)),
        "raw_flat_16MB": lambda: dist.all_reduce(flat, group=raw),
        "engine_160x100KB": engine_many,
        "raw_64MB": lambda: dist.all_reduce(big, group=raw),
        "engine_64MB": lambda: session.synchronize(session.submit("allreduce", big, "big", in_place=True)),
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for it in range(warmup + iters):
        order = list(cases) if it % 2 == 0 else list(reversed(cases))
        for name in order:
            reps = 10 if "1KB" in name else 1
            dist.barrier(group=raw)
            start = time.perf_counter()
            for _ in range(reps):
                cases[name]()
            if it >= warmup:
                samples[name].append((time.perf_counter() - start) / reps)
    negotiation = type(session.engine()._comm).__name__
    dist.destroy_process_group(raw)
    stop_baseline_group(baseline)
    session.shutdown()
    if rank != 0:
        return {}
    med = {k: round(statistics.median(v) * 1e3, 3) for k, v in samples.items()}
    return {
        "median_ms": med,
        "ratios": {"lone_1KB_engine_over_raw": round(med["engine_1KB"] / med["raw_1KB"], 3),
                   "160x100KB_engine_over_raw_flat": round(med["engine_160x100KB"] / med["raw_flat_16MB"], 3),
                   "64MB_engine_bandwidth_vs_raw": round(med["raw_64MB"] / med["engine_64MB"], 3)},
        "environment": {"torch": torch.__version__, "python": platform.python_version(), "ranks": 4,
                        "layout": "2 fake hosts x 2 ranks on one machine (loopback)", "cpus": os.cpu_count(),
                        "negotiation": negotiation, "accord_source": os.path.dirname(accord.__file__),
                        "iterations": iters, "warmup": warmup,
                        "load": list(os.getloadavg())},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args(argv)
    from accord.run.functions.spawn import spawn

    result = spawn(_worker, args=(args.iters, args.warmup), nprocs=4)[0]
    record(result, args.out, "negotiation_hosts.py", argv)
    for name, ms in result["median_ms"].items():
        print(f"{name:<18} {ms:10.3f} ms")
    for name, value in result["ratios"].items():
        print(f"{name}: {value}")
    print(f"negotiation: {result['environment']['negotiation']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
