"""Half-precision sums on shm against float32, per element, measured in the same run.

    python benchmarks/shm_half_sums.py [--nprocs 2] [--sizes 16MB,64MB] [--iters 9] [--warmup 2]
                                       [--out PATH]

For each buffer size, an in-place SUM allreduce of a float32, a bfloat16 and a float16 buffer of
that many bytes (so a half buffer holds twice the elements) on a shm communicator, 1 torch thread
per rank, a barrier before every sample, the cases taking turns; medians of the slowest rank.
Reported per element (ns), and each half dtype's time per element as a multiple of float32's:
issue #37 asks for <= 1.0 where the CPU has no native half arithmetic and < 1.0 where it has.

Also, on rank 0 alone, the kernel the reduction runs per element once its data is in cache: one
``out.add_(peer)`` over one shm chunk of each dtype (what two ranks' in-place sum does per chunk),
and the float32 detour for the half dtypes (widen both into float32, add, narrow back), so
the table shows whether torch's own half kernel or a float32 detour is cheaper on this CPU.
The CPU flags that mean native half arithmetic (``avx512_bf16``, ``avx512_fp16``, ``amx_bf16``,
``amx_fp16``) are read from /proc/cpuinfo. Writes benchmarks/results/shm_half_sums[_<n>ranks].json.
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

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "shm_half_sums.json")
HALF_FLAGS = ("avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16")


def _cpu_half_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return [f for f in HALF_FLAGS if f in line.split()]
    except OSError:
        pass
    return []


def _kernels(chunk: int, reps: int = 200) -> dict[str, float]:
    """ns per element of one chunk's in-cache reduction, per dtype (rank 0 only)."""
    import torch

    def timed(fn: Callable[[], Any], n: int) -> float:
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples) / n * 1e9

    def detour(mine: Any, peer: Any, wide_a: Any, wide_b: Any) -> Callable[[], None]:
        def run() -> None:
            wide_a.copy_(mine)
            wide_b.copy_(peer)
            wide_a.add_(wide_b)
            mine.copy_(wide_a)
        return run

    out: dict[str, float] = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        n = chunk // dtype.itemsize
        mine, peer = torch.randn(n).to(dtype), torch.randn(n).to(dtype)
        name = str(dtype).replace("torch.", "")
        out[f"{name}_add"] = timed(lambda mine=mine, peer=peer: mine.add_(peer), n)
        if dtype != torch.float32:
            out[f"{name}_via_float32"] = timed(detour(mine, peer, torch.empty(n), torch.empty(n)), n)
    return {k: round(v, 4) for k, v in out.items()}


def _worker(sizes: list[int], iters: int, warmup: int) -> dict:
    import torch
    import torch.distributed as dist

    from accord.bench.strategies import start_baseline_group, stop_baseline_group
    from accord.comm import ReduceOp
    from accord.comm.shm.backend import ShmBackend
    from accord.engine import session

    torch.set_num_threads(1)
    load_before = os.getloadavg()
    session.init()
    baseline = start_baseline_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    comm = session.build_communicator(ShmBackend(), range(size))
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    cases: dict[tuple[int, str], tuple[Callable[[], Any], int]] = {}
    for nbytes in sizes:
        for name, dtype in dtypes.items():
            # ones: every rank's sum stays a small whole number, exact in every dtype
            data = torch.ones(nbytes // dtype.itemsize, dtype=dtype)
            cases[(nbytes, name)] = (lambda data=data: comm.allreduce(data, ReduceOp.SUM), data.numel())
    samples: dict[tuple[int, str], list[float]] = {k: [] for k in cases}
    for it in range(warmup + iters):
        for key in cases if it % 2 == 0 else reversed(list(cases)):
            dist.barrier()
            start = time.perf_counter()
            cases[key][0]()
            elapsed = time.perf_counter() - start
            if it >= warmup:
                samples[key].append(elapsed)
    med = {f"{k[0] >> 20}MB {k[1]}": statistics.median(v) * 1e3 for k, v in samples.items()}
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, med)
    kernels = _kernels(comm.chunk_bytes) if rank == 0 else {}
    chunk = comm.chunk_bytes
    comm.close()
    stop_baseline_group(baseline)
    session.shutdown()
    if rank != 0:
        return {}
    rows: dict[str, Any] = {}
    for nbytes in sizes:
        label = f"{nbytes >> 20}MB"
        ms = {name: max(g[f"{label} {name}"] for g in gathered) for name in dtypes}
        per = {name: ms[name] * 1e6 / cases[(nbytes, name)][1] for name in dtypes}
        rows[label] = {
            "median_ms_slowest_rank": {k: round(v, 3) for k, v in ms.items()},
            "ns_per_element": {k: round(v, 3) for k, v in per.items()},
            "per_element_x_float32": {k: round(per[k] / per["float32"], 3) for k in ("bfloat16", "float16")},
        }
    return {"rows": rows, "kernel_ns_per_element_in_cache": kernels, "environment": {
        "torch": torch.__version__, "python": platform.python_version(), "world_size": size,
        "cpus": os.cpu_count(), "threads_per_rank": 1, "iterations": iters, "warmup": warmup,
        "shm_chunk_bytes": chunk, "native_half_cpu_flags": _cpu_half_flags(),
        "load_before_after": [list(load_before), list(os.getloadavg())]}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--sizes", default="16MB,64MB")
    parser.add_argument("--iters", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from accord.bench.stats import parse_size
    from accord.run.functions.spawn import spawn

    os.environ["ACCORD_CPU_BACKEND"] = "shm"  # inherited by the spawned ranks
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    out = args.out or (RESULTS if args.nprocs == 2 else RESULTS.replace(".json", f"_{args.nprocs}ranks.json"))
    result = spawn(_worker, args=(sizes, args.iters, args.warmup), nprocs=args.nprocs)[0]
    record(result, out, "shm_half_sums.py", argv)
    env = result["environment"]
    print(f"{args.nprocs} ranks, {os.cpu_count()} cpus, native half flags: {env['native_half_cpu_flags'] or 'none'}")
    def joined(values: dict[str, float]) -> str:
        return "  ".join(f"{k} {v:.3f}" for k, v in values.items())

    for label, row in result["rows"].items():
        print(f"{label:>6}: ns/element {joined(row['ns_per_element'])} | "
              f"x float32 per element {joined(row['per_element_x_float32'])}")
    print(f"in-cache kernel, ns/element: {joined(result['kernel_ns_per_element_in_cache'])}")
    print(f"load {env['load_before_after']}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
