"""A lone synchronous 1 KB allreduce, repeated: the engine against raw Gloo, 2 ranks, one run.

    python benchmarks/lone_allreduce.py [--backend gloo|shm|auto] [--ops 100] [--reps 7]

Each repetition times ``--ops`` allreduces of the same name through the engine, then the same
count of raw ``dist.all_reduce`` calls (medians over repetitions, the first dropped). Also
reports the engine's counters: with planned cycles (accord/engine/cycle/plan.py) a repeated step needs
no negotiation, so cycles ~= collectives and negotiations stay at the few before the plan.
Compare trees with PYTHONPATH=<tree>/src in one session. Writes
benchmarks/results/lone_allreduce.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from recording import record

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "lone_allreduce.json")


def _worker(ops: int, reps: int) -> dict:
    import torch
    import torch.distributed as dist

    from accord.engine import session

    torch.set_num_threads(1)
    session.init()
    from accord.bench.strategies import start_baseline_group, stop_baseline_group

    baseline = start_baseline_group()  # the raw torch.distributed baseline's default group
    tiny = torch.ones(256)
    pairs = []
    for rep in range(reps):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(ops):
            session.synchronize(session.submit("allreduce", tiny, "tiny", in_place=True))
        engine = (time.perf_counter() - start) / ops
        dist.barrier()
        start = time.perf_counter()
        for _ in range(ops):
            dist.all_reduce(tiny)
        raw = (time.perf_counter() - start) / ops
        if rep:
            pairs.append((engine, raw))
    stats = session.engine().stats()
    stop_baseline_group(baseline)
    session.shutdown()
    engine_ms = statistics.median(e for e, _ in pairs) * 1e3
    raw_ms = statistics.median(r for _, r in pairs) * 1e3
    return {"engine_ms": round(engine_ms, 3), "raw_ms": round(raw_ms, 3),
            "engine_over_raw": round(engine_ms / raw_ms, 3), "engine_stats": stats,
            "load": list(os.getloadavg())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--ops", type=int, default=100)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args(argv)
    os.environ["ACCORD_CPU_BACKEND"] = args.backend  # inherited by the spawned ranks
    from accord.run.functions.spawn import spawn

    result = spawn(_worker, args=(args.ops, args.reps), nprocs=2)[0]
    result["backend"] = args.backend
    record(result, args.out, "lone_allreduce.py", argv)
    print(f"engine {result['engine_ms']:.3f} ms, raw {result['raw_ms']:.3f} ms, "
          f"ratio {result['engine_over_raw']:.2f}; {result['engine_stats']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
