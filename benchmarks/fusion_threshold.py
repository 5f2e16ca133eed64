"""The fusion threshold, measured: ResNet-50's gradients through the engine at several thresholds.

    python benchmarks/fusion_threshold.py [--iters 8] [--warmup 2] [--backend gloo|shm|auto]

Two ranks submit ResNet-50's 161 gradient tensors (25.6 M float32, 102 MB; shapes from
accord.models, in reverse order as backward produces them) as async in-place allreduces, then
synchronize them all. The engine's fusion threshold (ACCORD_FUSION_THRESHOLD) takes each value in
turn, the order rotating every iteration so machine noise spreads over all of them; "off" (0)
reduces every tensor on its own. Reports the median time per threshold and the collectives it
took. Writes benchmarks/results/fusion_threshold_<backend>.json with the command.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import time

from recording import record

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
MB = 1024 * 1024
THRESHOLDS = [0, 4 * MB, 16 * MB, 32 * MB, 64 * MB, 128 * MB]


def _worker(iters: int, warmup: int) -> dict:
    import torch
    import torch.distributed as dist

    from accord.engine import session
    from accord.models import get_model

    torch.set_num_threads(1)
    session.init()
    from accord.bench.strategies import start_baseline_group, stop_baseline_group

    baseline = start_baseline_group()  # the raw torch.distributed baseline's default group
    engine = session.engine()
    base = engine.settings
    controller = engine._global  # every rank's set: where these requests are fused
    grads = [torch.ones(p.shape) for p in reversed(list(get_model("resnet50").parameters()))]

    def use(threshold: int) -> None:
        # every rank switches in lock step (between barriers): fusion must agree across ranks
        settings = dataclasses.replace(base, fusion_threshold=threshold)
        state = controller._state
        engine.settings = state.settings = state.intake._settings = settings
        controller.executor.fusion_threshold = threshold

    samples: dict[int, list[float]] = {t: [] for t in THRESHOLDS}
    collectives: dict[int, int] = {}
    for it in range(warmup + iters):
        shift = it % len(THRESHOLDS)
        for threshold in THRESHOLDS[shift:] + THRESHOLDS[:shift]:
            use(threshold)
            dist.barrier()
            before = controller.executor.collectives
            start = time.perf_counter()
            handles = [session.submit("allreduce", g, f"grad.{i}", in_place=True) for i, g in enumerate(grads)]
            for h in handles:
                session.synchronize(h)
            if it >= warmup:
                samples[threshold].append(time.perf_counter() - start)
                collectives[threshold] = controller.executor.collectives - before
    use(base.fusion_threshold)
    backend = session.backend_name("cpu")
    rank = session.topology().rank
    stop_baseline_group(baseline)
    session.shutdown()
    if rank != 0:
        return {}
    rows = {("off" if t == 0 else f"{t // MB} MB"): {
        "median_ms": round(statistics.median(samples[t]) * 1e3, 2),
        "collectives": collectives[t]} for t in THRESHOLDS}
    return {"thresholds": rows, "default": f"{base.fusion_threshold // MB} MB", "environment": {
        "torch": torch.__version__, "python": platform.python_version(), "ranks": 2,
        "engine_backend": backend, "tensors": len(grads),
        "megabytes": round(sum(g.nbytes for g in grads) / MB, 1), "cpus": os.cpu_count(),
        "iterations": iters, "warmup": warmup}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--backend", default="gloo", help="engine CPU backend: gloo (default), shm or auto")
    args = parser.parse_args(argv)
    os.environ["ACCORD_CPU_BACKEND"] = args.backend  # inherited by the spawned ranks
    from accord.run.functions.spawn import spawn

    result = spawn(_worker, args=(args.iters, args.warmup), nprocs=2)[0]
    path = os.path.join(RESULTS_DIR, f"fusion_threshold_{result['environment']['engine_backend']}.json")
    record(result, path, "fusion_threshold.py", argv)
    print(f"{result['environment']['tensors']} tensors, {result['environment']['megabytes']} MB, "
          f"backend {result['environment']['engine_backend']} (default threshold {result['default']})")
    for name, row in result["thresholds"].items():
        print(f"  {name:>7}: {row['median_ms']:8.2f} ms  ({row['collectives']} collectives)")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
