"""Collectives that return new tensors, with and without huge-page advice on their results.

    python benchmarks/fresh_results.py [--iters 10] [--warmup 2]

allgather, reducescatter and out-of-place allreduce return fresh tensors; the first write into
fresh memory faults it in page by page (see accord/comm/memory.py). Two ranks (default backend:
shm on one host) run each op through ``accord.torch`` on 64 MB of float32 results, alternating
every iteration between accord as shipped (``advised``) and the same code with the advice turned
off (``plain``), and report the median time of each. Writes
benchmarks/results/fresh_results.json with the command that produced it.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

from recording import record

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "fresh_results.json")


def _worker(iters: int, warmup: int) -> dict:
    import torch

    import accord.torch as hvd
    from accord.comm import memory

    torch.set_num_threads(1)
    hvd.init()
    n = 16 * 1024 * 1024  # 64 MB of float32 results
    half = torch.ones(n // 2)
    full = torch.ones(n)
    ops = {
        "allgather (32 MB in, 64 MB out)": lambda: hvd.allgather(half, name="ag"),
        "reducescatter (64 MB in, 32 MB out)": lambda: hvd.reducescatter(full, name="rs", op=hvd.Sum),
        "allreduce out of place (64 MB)": lambda: hvd.allreduce(full, name="ar", op=hvd.Sum),
    }
    advise = memory._lookup_madvise()
    samples = {op: {"advised": [], "plain": []} for op in ops}
    for op, fn in ops.items():
        for it in range(warmup + iters):
            for mode in (("advised", "plain") if it % 2 == 0 else ("plain", "advised")):
                memory._madvise = advise if mode == "advised" else False
                hvd.barrier()
                start = time.perf_counter()
                fn()
                if it >= warmup:
                    samples[op][mode].append(time.perf_counter() - start)
    memory._madvise = advise
    rank = hvd.rank()
    backend = __import__("accord.engine.session", fromlist=["backend_name"]).backend_name("cpu")
    hvd.shutdown()
    if rank != 0:
        return {}
    table = {}
    for op in ops:
        a, p = (statistics.median(samples[op][m]) for m in ("advised", "plain"))
        table[op] = {"advised_ms": round(a * 1e3, 2), "plain_ms": round(p * 1e3, 2), "speedup": round(p / a, 2)}
    return {"ops": table, "environment": {
        "torch": torch.__version__, "python": platform.python_version(), "ranks": 2, "backend": backend,
        "cpus": os.cpu_count(), "iterations": iters, "warmup": warmup,
        "huge_pages_available": bool(advise)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    from accord.run.functions.spawn import spawn

    result = spawn(_worker, args=(args.iters, args.warmup), nprocs=2)[0]
    record(result, RESULTS, "fresh_results.py", argv)
    print(f"{'op':<38}  {'plain ms':>9}  {'advised ms':>10}  speed-up")
    for op, row in result["ops"].items():
        print(f"{op:<38}  {row['plain_ms']:>9.2f}  {row['advised_ms']:>10.2f}  {row['speedup']:.2f}x")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
