"""The engine against raw Gloo, side by side in one 2-rank run.

    python benchmarks/engine_allreduce.py [--iters 15] [--warmup 3] [--backend auto|gloo|shm]

``--backend`` picks the engine's CPU backend (ACCORD_CPU_BACKEND; auto, the default, is shm on one
host); the raw baseline is always ``torch.distributed`` Gloo. Results go to engine_allreduce.json
(gloo) or engine_allreduce_shm.json (shm, auto).

Two workloads, each timed per iteration between barriers, raw and engine interleaved (the order
alternates every iteration) so machine noise hits both alike; medians after warm-up:

1. one 64 MB float32 tensor: ``dist.all_reduce`` vs ``allreduce_`` through the engine
   (target: engine bus bandwidth >= 0.95x raw);
2. 160 tensors of 100 KB submitted async, then synchronized, vs one pre-flattened allreduce of
   the same 16 MB (target: <= 1.1x). For context it also times raw one-by-one allreduces, a
   hand-fused baseline (cat + allreduce + copy back: what any fusing engine must do), and the
   engine on 160 tensors that are views of one flat buffer (its zero-copy path);
3. latency: 20 synchronous 1 KB allreduces, raw vs through the engine.

Prints a table and writes benchmarks/results/engine_allreduce.json.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

from recording import record

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "engine_allreduce.json")


def _stats(samples: list[float]) -> dict[str, float]:
    ms = [s * 1e3 for s in samples]
    mean = statistics.fmean(ms)
    ci = 1.96 * statistics.stdev(ms) / len(ms) ** 0.5 if len(ms) > 1 else 0.0
    return {"median_ms": round(statistics.median(ms), 3), "mean_ms": round(mean, 3), "ci95_ms": round(ci, 3)}


def _worker(iters: int, warmup: int) -> dict:
    import torch
    import torch.distributed as dist

    from accord.engine import session

    torch.set_num_threads(1)
    session.init()
    from accord.bench.strategies import start_baseline_group, stop_baseline_group

    baseline = start_baseline_group()  # the raw torch.distributed baseline's default group
    rank = session.topology().rank
    big = torch.ones(16 * 1024 * 1024)  # 64 MB
    smalls = [torch.ones(25_600) for _ in range(160)]  # 100 KB each, separately allocated
    flat = torch.ones(25_600 * 160)
    views = list(torch.ones(25_600 * 160).split(25_600))  # 160 views of one buffer
    tiny = torch.ones(256)  # 1 KB

    def engine_many(tensors, prefix):
        handles = [session.submit("allreduce", t, f"{prefix}.{i:03d}", in_place=True)
                   for i, t in enumerate(tensors)]
        for h in handles:
            session.synchronize(h)

    def hand_fused():
        torch.cat(smalls, out=flat)
        dist.all_reduce(flat)
        torch._foreach_copy_(smalls, list(flat.split(25_600)))

    cases = {
        "raw_64MB": lambda: dist.all_reduce(big),
        "engine_64MB": lambda: session.synchronize(session.submit("allreduce", big, "big", in_place=True)),
        "raw_flat_16MB": lambda: dist.all_reduce(flat),
        "engine_160x100KB": lambda: engine_many(smalls, "g"),
        "raw_hand_fused_160x100KB": hand_fused,
        "engine_160x100KB_adjacent_views": lambda: engine_many(views, "v"),
        "raw_one_by_one_160x100KB": lambda: [dist.all_reduce(t) for t in smalls],
        # latency: 20 synchronous 1 KB allreduces in a row (per-op cost = time / 20)
        "raw_20x1KB_sync": lambda: [dist.all_reduce(tiny) for _ in range(20)],
        "engine_20x1KB_sync": lambda: [session.synchronize(session.submit("allreduce", tiny, "tiny", in_place=True))
                                       for _ in range(20)],
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for it in range(warmup + iters):
        order = list(cases) if it % 2 == 0 else list(reversed(cases))
        for name in order:
            dist.barrier()
            start = time.perf_counter()
            cases[name]()
            elapsed = time.perf_counter() - start
            if it >= warmup:
                samples[name].append(elapsed)
    stats = session.engine().stats()
    backend = session.backend_name("cpu")
    stop_baseline_group(baseline)
    session.shutdown()
    if rank != 0:
        return {}
    out = {name: _stats(s) for name, s in samples.items()}
    med = {name: v["median_ms"] for name, v in out.items()}
    return {
        "timings": out,
        "ratios": {
            "engine_64MB_bus_bandwidth_vs_raw": round(med["raw_64MB"] / med["engine_64MB"], 3),
            "engine_160x100KB_time_vs_raw_flat": round(med["engine_160x100KB"] / med["raw_flat_16MB"], 3),
            "engine_160x100KB_time_vs_hand_fused": round(med["engine_160x100KB"] / med["raw_hand_fused_160x100KB"], 3),
            "engine_adjacent_views_time_vs_raw_flat":
                round(med["engine_160x100KB_adjacent_views"] / med["raw_flat_16MB"], 3),
            "raw_one_by_one_time_vs_raw_flat": round(med["raw_one_by_one_160x100KB"] / med["raw_flat_16MB"], 3),
            "engine_1KB_latency_vs_raw": round(med["engine_20x1KB_sync"] / med["raw_20x1KB_sync"], 3),
        },
        "engine_stats_rank0": stats,
        "environment": {
            "torch": torch.__version__, "python": platform.python_version(), "world_size": 2,
            "engine_backend": backend,
            "raw_backend": "torch.distributed gloo (tcp loopback)", "cpus": os.cpu_count(), "threads_per_rank": 1,
            "iterations": iters, "warmup": warmup,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--backend", default="auto",
                        help="engine CPU backend: auto (the default: shm on one host), gloo or shm")
    args = parser.parse_args(argv)
    os.environ["ACCORD_CPU_BACKEND"] = args.backend  # inherited by the spawned ranks
    results_path = RESULTS if args.backend == "gloo" else RESULTS.replace(".json", f"_{args.backend}.json")
    if args.backend == "auto":  # on this one host auto means shm: same file
        results_path = RESULTS.replace(".json", "_shm.json")
    from accord.run.functions.spawn import spawn

    result = spawn(_worker, args=(args.iters, args.warmup), nprocs=2)[0]
    record(result, results_path, "engine_allreduce.py", argv)
    width = max(len(k) for k in result["timings"])
    print(f"{'case':<{width}}  median ms   mean ± 1.96σ/√n")
    for name, t in result["timings"].items():
        print(f"{name:<{width}}  {t['median_ms']:9.2f}   {t['mean_ms']:.2f} ± {t['ci95_ms']:.2f}")
    for name, value in result["ratios"].items():
        print(f"{name}: {value}")
    print(f"wrote {results_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
