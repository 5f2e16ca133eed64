"""Where a synchronous small ``dist.all_reduce`` on the accord backend spends its time, against
Gloo and ``hvd.allreduce_`` on the same engine, 2 ranks of one host, in one run.

    python benchmarks/profile_backend_call.py [--bytes 1024] [--ops 200] [--reps 7] [--cprofile 500]
                                              [--nprocs 2]

One pair of ranks (1 torch thread each, env:// on a free port): the default group is accord's,
``hvd.init()`` joins the same engine, a ``gloo`` group beside them. Timed cases, interleaved (the
order alternates every repetition, a barrier before each batch of ``--ops`` calls; medians over
repetitions, the first dropped):

- ``gloo``: ``dist.all_reduce(t, group=gloo)``;
- ``accord``: ``dist.all_reduce(t)`` (torch's Python wrapper, then the Python process group:
  torch calls a Python ``ProcessGroup`` subclass's method directly, without its dispatcher);
- ``accord_group_call``: ``pg.allreduce([t], opts).wait()`` (the wrapper left out);
- ``hvd_allreduce_``: ``hvd.allreduce_(t, op=Sum, name=...)`` on the same engine.

Each case reports wall time per call and the calling thread's CPU time per call
(``time.thread_time``: a synchronous call runs the engine's planned cycle on that thread, so on a
loaded machine it shows the path's own cost where wall time mostly shows the scheduler).

Then a traced pass of ``accord``: wrappers record ``perf_counter_ns`` at the boundaries of the
path (torch's wrapper, the group's method, the call's name, the engine's submission, the
``Work``, its completion, ``wait``), and the table gives the median time of each segment (the
wrappers' own cost is the difference between the traced total and the untraced ``accord``).
``--cprofile N`` profiles N ``accord`` calls on rank 0 and lists the functions with the most own
time. ``--nprocs 1`` is the proxy for a busy machine: no peer to wait on, so what is left is
each path's own Python and torch work per call. Writes benchmarks/results/profile_backend_call.json.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import timedelta
from typing import Any, Callable

import profile_engine_call
from profile_engine_call import Tracer
from recording import record
from torch_distributed_backend import _setup, _spawn

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "profile_backend_call.json")

# (segment, from event, to event), consecutive on the path a synchronous call takes
profile_engine_call.SEGMENTS["backend"] = [
    ("torch's all_reduce wrapper, until the group's method", "call", "pg_in"),
    ("reduce op, dtype check", "pg_in", "names_in"),
    ("the call's name (describe, GroupNames.next)", "names_in", "names_out"),
    ("until the engine's submission", "names_out", "submit_in"),
    ("engine.submit_group", "submit_in", "submit_out"),
    ("the Work object (future, callbacks)", "work_in", "work_out"),
    ("back to torch's wrapper, until wait()", "work_out", "wait_in"),
    ("wait: the engine's cycle on this thread", "wait_in", "complete_in"),
    ("the Work's completion (finish, future)", "complete_in", "complete_out"),
    ("wait returns", "complete_out", "wait_out"),
    ("back to the caller", "wait_out", "returned"),
]


def _worker(rank: int, port: int, size: int, nbytes: int, ops: int, reps: int, cprofile_ops: int,
            queue: Any) -> None:
    _setup(rank, port, size)
    import torch
    import torch.distributed as dist

    import accord.distributed  # noqa: F401
    import accord.torch as hvd
    from accord import engine
    from accord.distributed import naming, process_group, work

    load_before = os.getloadavg()[0]
    dist.init_process_group("accord", timeout=timedelta(seconds=300))
    hvd.init()
    gloo = dist.new_group(list(range(size)), backend="gloo")
    pg = dist.distributed_c10d._get_default_group()
    tensor = torch.ones(max(nbytes // 4, 1))
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = False  # as torch's synchronous wrapper sets it

    cases: dict[str, Callable[[], Any]] = {
        "gloo": lambda: dist.all_reduce(tensor, group=gloo),
        "accord": lambda: dist.all_reduce(tensor),
        "accord_group_call": lambda: pg.allreduce([tensor], opts).wait(),
        "hvd_allreduce_": lambda: hvd.allreduce_(tensor, op=hvd.Sum, name="h_"),
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}  # the calling thread's CPU time
    for rep in range(reps + 1):
        for name in cases if rep % 2 == 0 else reversed(list(cases)):
            fn = cases[name]
            dist.barrier(group=gloo)
            start, start_cpu = time.perf_counter(), time.thread_time()
            for _ in range(ops):
                fn()
            if rep:  # the first repetition warms up (and lets the engine's plans form)
                samples[name].append((time.perf_counter() - start) / ops)
                cpu[name].append((time.thread_time() - start_cpu) / ops)

    tracer = Tracer()
    group_cls = process_group.AccordProcessGroup
    tracer.wrap(group_cls, "allreduce", "pg_in", None)
    tracer.wrap(naming.GroupNames, "next", "names_in", "names_out")
    tracer.wrap(engine, "submit_group", "submit_in", "submit_out")
    tracer.wrap(work.AccordWork, "__init__", "work_in", "work_out")
    tracer.wrap(work.AccordWork, "_complete", "complete_in", "complete_out")
    tracer.wrap(work.AccordWork, "wait", "wait_in", "wait_out")
    dist.barrier(group=gloo)
    tracer.on = True
    for _ in range(ops):
        tracer.mark("call")
        cases["accord"]()
        tracer.mark("returned")
    tracer.on = False
    traced = profile_engine_call._segments(list(tracer.events), "backend")
    traced.pop("calls whose data barrier slept (%)", None)
    tracer.unwrap()

    profile_text = ""
    if cprofile_ops:
        import cProfile
        import io
        import pstats

        dist.barrier(group=gloo)
        prof = cProfile.Profile() if rank == 0 else None
        if prof is not None:
            prof.enable()
        for _ in range(cprofile_ops):
            cases["accord"]()
        if prof is not None:
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
            profile_text = buf.getvalue()
    stats = engine.current_engine().stats()
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    hvd.shutdown()
    med = {k: round(statistics.median(v) * 1e3, 4) for k, v in samples.items()}
    spread = {k: [round(min(v) * 1e3, 4), round(max(v) * 1e3, 4)] for k, v in samples.items()}
    queue.put((rank, {
        "median_ms_per_call": med, "min_max_ms_per_call": spread,
        "median_thread_cpu_us_per_call": {k: round(statistics.median(v) * 1e6, 2) for k, v in cpu.items()},
        "accord_over_gloo_time": round(med["accord"] / med["gloo"], 3),
        "traced_us": traced, "engine_stats": stats, "cprofile_rank0": profile_text,
        "environment": {"torch": torch.__version__, "python": platform.python_version(),
                        "world_size": size, "bytes": tensor.numel() * 4, "ops_per_sample": ops, "reps": reps,
                        "cpus": os.cpu_count(), "threads_per_rank": 1,
                        "load_before_after": [load_before, os.getloadavg()[0]]},
    }))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bytes", type=int, default=1024, help="tensor size (float32)")
    parser.add_argument("--ops", type=int, default=200, help="calls per timed batch")
    parser.add_argument("--reps", type=int, default=7, help="timed batches per case (after one warm-up)")
    parser.add_argument("--cprofile", type=int, default=500, help="accord calls to profile on rank 0 (0: none)")
    parser.add_argument("--nprocs", type=int, default=2,
                        help="ranks; 1 measures the path's own Python and torch work, with no peer to wait on")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args(argv)
    result = _spawn(_worker, args.nprocs, args.bytes, args.ops, args.reps, args.cprofile, nprocs=args.nprocs)[0][0]
    record(result, args.out, "profile_backend_call.py", argv)
    print(f"{'case':<20} {'ms/call':>9}  min..max          caller's CPU us/call")
    for name, ms in result["median_ms_per_call"].items():
        low, high = result["min_max_ms_per_call"][name]
        print(f"{name:<20} {ms:9.4f}  {low:.4f}..{high:.4f}  {result['median_thread_cpu_us_per_call'][name]:8.1f}")
    print(f"accord / gloo time: {result['accord_over_gloo_time']:.2f}")
    print("\naccord path (median us per segment, one call):")
    for label, us in result["traced_us"].items():
        print(f"  {label:<52} {us if us is not None else '-':>8}")
    if result["cprofile_rank0"]:
        print("\n" + result["cprofile_rank0"])
    print(f"engine stats {result['engine_stats']}; load {result['environment']['load_before_after']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
