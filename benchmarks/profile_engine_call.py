"""Where a synchronous small allreduce's time goes: the communicator alone against the engine,
with a breakdown along the engine's path, 2 ranks of one host, in one run.

    python benchmarks/profile_engine_call.py [--backend shm|gloo] [--bytes 1024] [--ops 200]
                                            [--reps 9] [--cprofile 0] [--nprocs 2]

``--nprocs 1`` is the proxy for a busy machine: no peer to wait on, so what remains is the
engine's own Python and torch work per call (the same path: planned, run on the caller).

Timed cases, interleaved (the order alternates every repetition, a barrier before each batch of
``--ops`` calls; medians over repetitions, the first dropped):

- ``comm``: ``communicator.allreduce`` on a communicator of the engine's CPU backend (built
  beside the engine's, same settings), no engine;
- ``engine``: ``session.synchronize(session.submit(...))`` of the same tensor (in place, one
  name: planned after three cycles, and run on the calling thread; the submission, not known
  to be waited on, wakes the engine's thread, which then waits for the caller's cycle);
- ``engine_waited``: the same submitted as the synchronous hvd calls do (``waited=True``:
  the engine's thread is not woken);
- ``hvd_allreduce`` / ``hvd_allreduce_``: ``accord.torch.allreduce`` (a new tensor) and
  ``allreduce_`` (in place), what Horovod scripts call;
- ``engine_negotiated``: the engine with planning switched off for this name, so every call
  is a negotiated cycle on the controller's thread: two thread hand-offs, one negotiation.

Then a traced pass (the communicator alone, ``engine_waited`` on the planned path, and
``engine_negotiated``): wrappers record ``perf_counter_ns`` at the boundaries of the path (submit,
request built, enqueued, synchronize, run on the caller or the controller thread, executor,
communicator in/out, completion, return) and the table gives the median time of each segment
(the wrappers' own cost is the difference between the traced and untraced ``engine`` totals).
``--cprofile N`` also profiles N engine calls on rank 0 and prints the functions with the most
own time. Writes benchmarks/results/profile_engine_call.json.
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

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "profile_engine_call.json")

# (segment, from event, to event): consecutive events of one call on the path it took
SEGMENTS = {
    "comm": [("communicator allreduce", "comm_in", "comm_out")],
    "planned": [
        ("submit: name, request, enqueue", "call", "submitted"),
        ("synchronize until the caller runs the cycle", "submitted", "executor"),
        ("executor: stage, scale (before the communicator)", "executor", "comm_in"),
        ("communicator allreduce", "comm_in", "comm_out"),
        ("executor: control check, result copy", "comm_out", "complete_in"),
        ("complete: release names, set handles", "complete_in", "complete_out"),
        ("return to the caller", "complete_out", "returned"),
    ],
    "negotiated": [
        ("submit: name, request, enqueue", "call", "submitted"),
        ("hand-off: engine thread wakes, takes the request", "submitted", "negotiate_in"),
        ("negotiation allreduce", "negotiate_in", "negotiate_out"),
        ("decide, then executor until the communicator", "negotiate_out", "comm_in"),
        ("communicator allreduce", "comm_in", "comm_out"),
        ("executor until completion", "comm_out", "complete_in"),
        ("complete: release names, set handles", "complete_in", "complete_out"),
        ("hand-off: waiting caller wakes and returns", "complete_out", "returned"),
    ],
}


class Tracer:
    """Wraps functions on the engine's path to record (event, perf_counter_ns) per call."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.on = False
        self.muted = False  # inside a wrapper with mute=True: nested events are not recorded
        self._undo: list[tuple[Any, str, Any]] = []

    def mark(self, event: str) -> None:
        if self.on and not self.muted:
            self.events.append((event, time.perf_counter_ns()))

    def wrap(self, owner: Any, attr: str, before: str | None, after: str | None, mute: bool = False) -> None:
        """Record ``before`` and ``after`` around ``owner.attr``; ``mute``: nothing in between
        (the negotiation's allreduce runs on the same communicator as the data's)."""
        original = getattr(owner, attr)
        tracer = self

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if before:
                tracer.mark(before)
            tracer.muted = mute or tracer.muted
            try:
                return original(*args, **kwargs)
            finally:
                if mute:
                    tracer.muted = False
                if after:
                    tracer.mark(after)

        self._undo.append((owner, attr, original))
        setattr(owner, attr, wrapped)

    def unwrap(self) -> None:
        for owner, attr, original in reversed(self._undo):
            setattr(owner, attr, original)
        self._undo.clear()


def _segments(events: list[tuple[str, int]], path: str) -> dict[str, float]:
    """Median microseconds per segment over the calls in ``events`` (split at each "call")."""
    calls: list[dict[str, int]] = []
    for name, t in events:
        if name == "call":
            calls.append({})
        if calls and name not in calls[-1]:  # first occurrence per call
            calls[-1][name] = t
    out = {}
    for label, a, b in SEGMENTS[path]:
        spans = [(c[b] - c[a]) / 1e3 for c in calls if a in c and b in c]
        out[label] = round(statistics.median(spans), 2) if spans else None
    totals = [(c["returned"] - c["call"]) / 1e3 for c in calls if "returned" in c]
    out["total (traced)"] = round(statistics.median(totals), 2) if totals else None
    # the data collective's barrier (the first sleep after comm_in) slept in the kernel
    slept = [c for c in calls if "sleep_in" in c and "comm_in" in c and c["sleep_in"] >= c["comm_in"]]
    out["calls whose data barrier slept (%)"] = round(100 * len(slept) / max(len(calls), 1), 1)
    if slept:
        out["its sleep, median"] = round(statistics.median((c["sleep_out"] - c["sleep_in"]) / 1e3
                                                           for c in slept if "sleep_out" in c), 2)
    return out


def _worker(backend: str, nbytes: int, ops: int, reps: int, cprofile_ops: int) -> dict:
    import torch
    import torch.distributed as dist

    import accord.torch as hvd
    from accord.comm import ReduceOp, get_backend
    from accord.engine import session
    from accord.engine.cycle import execute, negotiated, plan

    torch.set_num_threads(1)
    load_before = os.getloadavg()
    hvd.init()
    from accord.bench.strategies import start_baseline_group, stop_baseline_group

    baseline = start_baseline_group()  # the barriers between timed batches
    rank = session.topology().rank
    # A communicator of the engine's backend of its own: the engine's negotiates on its own
    # (idle ticks), which would interleave with calls made here.
    comm = session.build_communicator(get_backend(session.backend_name("cpu")), range(session.topology().size))
    tensor = torch.ones(max(nbytes // 4, 1))

    # Planning off for names starting "np.": every such call is a negotiated cycle.
    plannable = plan.plannable
    plan.plannable = lambda ready, *a, **k: None if ready[0].name.startswith("np.") else plannable(ready, *a, **k)

    def engine_call(name: str) -> None:
        session.synchronize(session.submit("allreduce", tensor, name, in_place=True))

    def engine_waited(name: str) -> None:  # what the synchronous hvd calls submit: the thread is not woken
        session.synchronize(session.submit_group("allreduce", [tensor], name, in_place=True, grouped=False,
                                                 waited=True)[0])

    cases: dict[str, Callable[[], Any]] = {
        "comm": lambda: comm.allreduce(tensor, ReduceOp.SUM),
        "engine": lambda: engine_call("tiny"),
        "engine_waited": lambda: engine_waited("tiny_w"),
        "hvd_allreduce": lambda: hvd.allreduce(tensor, name="h", op=hvd.Sum),
        "hvd_allreduce_": lambda: hvd.allreduce_(tensor, name="h_", op=hvd.Sum),
        "engine_negotiated": lambda: engine_call("np.tiny"),
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for rep in range(reps + 1):
        for name in cases if rep % 2 == 0 else reversed(list(cases)):
            fn = cases[name]
            dist.barrier()
            start = time.perf_counter()
            for _ in range(ops):
                fn()
            if rep:  # the first repetition warms up (and lets the plans form)
                samples[name].append((time.perf_counter() - start) / ops)

    # The traced pass: every call records its events (the wrappers cost a little: see totals).
    tracer = Tracer()
    comm_cls = type(comm)
    tracer.wrap(comm_cls, "allreduce", "comm_in", "comm_out")
    if getattr(comm_cls, "allreduce_voted", None) is not None:  # a planned cycle's collective (shm)
        tracer.wrap(comm_cls, "allreduce_voted", "comm_in", "comm_out")
    tracer.wrap(execute.Executor, "run", "executor", None)
    tracer.wrap(session.engine().executor, "complete", "complete_in", "complete_out")  # an instance attribute
    tracer.wrap(session, "submit_group", None, "submitted")  # (submit calls it)
    tracer.wrap(negotiated.NegotiatedCycles, "negotiate", "negotiate_in", "negotiate_out", mute=True)
    barrier = getattr(comm, "_barrier_impl", None)  # shm: did the wait sleep in the kernel?
    if barrier is not None and hasattr(barrier, "_sleep"):
        tracer.wrap(barrier, "_sleep", "sleep_in", "sleep_out")
    traced = {}
    for path, fn in (("comm", cases["comm"]), ("planned", cases["engine_waited"]),
                     ("negotiated", cases["engine_negotiated"])):
        dist.barrier()
        tracer.events.clear()
        tracer.on = True
        for _ in range(ops):
            tracer.mark("call")
            fn()
            tracer.mark("returned")
        tracer.on = False
        traced[path] = _segments(list(tracer.events), path)
    tracer.unwrap()
    comm.close()

    profile_text = ""
    if cprofile_ops:
        import cProfile
        import io
        import pstats

        dist.barrier()
        prof = cProfile.Profile() if rank == 0 else None
        if prof is not None:
            prof.enable()
        for _ in range(cprofile_ops):
            engine_call("tiny")
        if prof is not None:
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
            profile_text = buf.getvalue()
    stats = session.engine().stats()
    backend_name = session.backend_name("cpu")
    session_size = session.topology().size
    dist.barrier()
    stop_baseline_group(baseline)
    hvd.shutdown()
    if rank != 0:
        return {}
    med = {k: round(statistics.median(v) * 1e3, 4) for k, v in samples.items()}
    return {
        "median_ms_per_call": med,
        "engine_minus_comm_ms": {k: round(v - med["comm"], 4) for k, v in med.items() if k != "comm"},
        "traced_us": traced,
        "engine_stats_rank0": stats,
        "cprofile_rank0": profile_text,
        "environment": {"torch": torch.__version__, "python": platform.python_version(), "world_size": session_size,
                        "backend": backend_name, "bytes": tensor.numel() * 4, "ops_per_sample": ops,
                        "reps": reps, "cpus": os.cpu_count(), "threads_per_rank": 1,
                        "load_before_after": [list(load_before), list(os.getloadavg())]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="shm", help="the engine's CPU backend: shm (default) or gloo")
    parser.add_argument("--bytes", type=int, default=1024, help="tensor size (float32)")
    parser.add_argument("--ops", type=int, default=200, help="calls per timed batch")
    parser.add_argument("--reps", type=int, default=9, help="timed batches per case (after one warm-up)")
    parser.add_argument("--cprofile", type=int, default=0, help="engine calls to profile on rank 0 (0: none)")
    parser.add_argument("--nprocs", type=int, default=2,
                        help="ranks; 1 measures the engine's own Python path with no peer to wait on")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args(argv)
    os.environ["ACCORD_CPU_BACKEND"] = args.backend  # inherited by the spawned ranks
    from accord.run.functions.spawn import spawn

    result = spawn(_worker, args=(args.backend, args.bytes, args.ops, args.reps, args.cprofile),
                   nprocs=args.nprocs)[0]
    record(result, args.out, "profile_engine_call.py", argv)
    comm_ms = result["median_ms_per_call"]["comm"]
    print(f"{'case':<20} {'ms/call':>9} {'- comm':>9}")
    for name, ms in result["median_ms_per_call"].items():
        print(f"{name:<20} {ms:9.4f} {ms - comm_ms:9.4f}")
    for path, segs in result["traced_us"].items():
        print(f"\n{path} path (median us per segment, one call):")
        for label, us in segs.items():
            print(f"  {label:<52} {us if us is not None else '-':>8}")
    if result["cprofile_rank0"]:
        print("\n" + result["cprofile_rank0"])
    print(f"stats {result['engine_stats_rank0']}; load {result['environment']['load_before_after']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
