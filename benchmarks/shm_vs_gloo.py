"""The shm backend against Gloo: allreduce on 2 ranks of one host, side by side in one run.

    python benchmarks/shm_vs_gloo.py [--iters 15] [--warmup 3] [--chunk-bytes N] [--spin-us U]

Three communicators over the same two ranks (spawned here, 1 torch thread each):

- ``shm``: the shm backend as configured by default (futex barrier, ACCORD_SHM_CHUNK_BYTES);
- ``shm_gloo_sync``: the same data path, but every phase waits in ``dist.barrier`` on a Gloo
  group instead of the futex barrier (the fallback; shows what the futex buys);
- ``gloo``: torch.distributed's Gloo (tcp loopback), the baseline.

For each size (4 B, 1 KB, 64 KB, 1 MB, 16 MB, 64 MB of float32) one sample times a batch of
back-to-back allreduces (many for small sizes, so the timer's resolution does not matter) and
divides; the three communicators take turns (order alternating every iteration, a Gloo barrier
before each batch) so machine noise hits them alike. Reported: median latency, mean ± 1.96σ,
bus bandwidth (NCCL-tests' definition, accord.bench.stats), CPU time per op on rank 0 (process
time, every thread: shows who spins), and shm's speed-up over each baseline. Writes
benchmarks/results/shm_vs_gloo.json with the command that produced it.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

from recording import record

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "shm_vs_gloo.json")
SIZES = [4, 1024, 64 * 1024, 1024 ** 2, 16 * 1024 ** 2, 64 * 1024 ** 2]
CASES = ("shm", "shm_gloo_sync", "gloo")


def _reps(size: int) -> int:
    """Ops per timed batch: about 1-20 ms of work per batch at shm speed."""
    return 200 if size <= 64 * 1024 else 20 if size <= 1024 ** 2 else 3 if size <= 16 * 1024 ** 2 else 1


def _worker(iters: int, warmup: int, chunk_bytes: int | None, spin_us: float) -> dict:
    import torch
    import torch.distributed as dist

    from accord import engine
    from accord.bench import stats
    from accord.bench.strategies import start_baseline_group, stop_baseline_group
    from accord.comm import ReduceOp, get_backend
    from accord.comm.shm.backend import ShmBackend

    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]  # the machine is shared: say how busy it was
    engine.init()
    baseline = start_baseline_group()  # for the barriers between timed runs
    rank = dist.get_rank()
    comms = {
        "shm": engine.build_communicator(ShmBackend(chunk_bytes=chunk_bytes, spin_s=spin_us * 1e-6), range(2)),
        "shm_gloo_sync": engine.build_communicator(ShmBackend(chunk_bytes=chunk_bytes, sync="gloo"), range(2)),
        "gloo": engine.build_communicator(get_backend("gloo"), range(2)),
    }
    for name, comm in comms.items():  # correct before fast
        check = torch.full((1000,), float(rank + 1))
        comm.allreduce(check, ReduceOp.SUM)
        assert check.eq(3.0).all(), f"{name} allreduce is wrong: {check[:4].tolist()}"
    rows = {}
    for size in SIZES:
        tensor = torch.zeros(size // 4)
        reps = _reps(size)
        wall = {name: [] for name in CASES}
        cpu = {name: [] for name in CASES}
        for it in range(warmup + iters):
            for name in CASES if it % 2 == 0 else reversed(CASES):
                comm = comms[name]
                dist.barrier()
                c0, t0 = time.process_time(), time.perf_counter()
                for _ in range(reps):
                    comm.allreduce(tensor, ReduceOp.SUM)
                t1, c1 = time.perf_counter(), time.process_time()
                if it >= warmup:
                    wall[name].append((t1 - t0) / reps)
                    cpu[name].append((c1 - c0) / reps)
        row = {}
        for name in CASES:
            s = stats.summarize(wall[name])
            row[name] = {
                "median_ms": round(s.median * 1e3, 4), "mean_ms": round(s.mean * 1e3, 4),
                "ci95_ms": round(s.ci95 * 1e3, 4),
                "busbw_GBps": round(stats.busbw("allreduce", size, s.median, 2), 3),
                "cpu_ms_per_op_rank0": round(stats.summarize(cpu[name]).median * 1e3, 4),
            }
        row["speedup_vs_gloo"] = round(stats.speedup(row["shm"]["median_ms"], row["gloo"]["median_ms"], False), 2)
        row["speedup_vs_shm_gloo_sync"] = round(
            stats.speedup(row["shm"]["median_ms"], row["shm_gloo_sync"]["median_ms"], False), 2)
        rows[stats.format_size(size)] = row
    chunk = comms["shm"].chunk_bytes
    for comm in comms.values():
        comm.close()
    stop_baseline_group(baseline)
    engine.shutdown()
    if rank != 0:
        return {}
    return {
        "allreduce_float32_sum": rows,
        "environment": {
            "torch": torch.__version__, "python": platform.python_version(), "world_size": 2,
            "cpus": os.cpu_count(), "threads_per_rank": 1, "iterations": iters, "warmup": warmup,
            "shm_chunk_bytes": chunk, "shm_spin_us": spin_us,
            "reps_per_sample": {stats.format_size(s): _reps(s) for s in SIZES},
            "load_average_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--chunk-bytes", type=int, default=None, help="shm slot size (default: config)")
    parser.add_argument("--spin-us", type=float, default=50.0, help="shm spin before sleeping")
    parser.add_argument("--out", default=RESULTS, help="where to write the JSON")
    args = parser.parse_args(argv)
    from accord.run.functions.spawn import spawn

    result = spawn(_worker, args=(args.iters, args.warmup, args.chunk_bytes, args.spin_us), nprocs=2)[0]
    record(result, args.out, "shm_vs_gloo.py", argv)
    print(f"{'size':>6} | {'shm ms':>9} {'GB/s':>6} {'cpu':>7} | {'shm+gloo-sync':>13} {'GB/s':>6} | "
          f"{'gloo ms':>8} {'GB/s':>6} {'cpu':>7} | {'x gloo':>6} {'x sync':>6}")
    for size, row in result["allreduce_float32_sum"].items():
        a, b, g = row["shm"], row["shm_gloo_sync"], row["gloo"]
        print(f"{size:>6} | {a['median_ms']:9.4f} {a['busbw_GBps']:6.2f} {a['cpu_ms_per_op_rank0']:7.4f} | "
              f"{b['median_ms']:13.4f} {b['busbw_GBps']:6.2f} | {g['median_ms']:8.4f} {g['busbw_GBps']:6.2f} "
              f"{g['cpu_ms_per_op_rank0']:7.4f} | {row['speedup_vs_gloo']:6.2f} {row['speedup_vs_shm_gloo_sync']:6.2f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
