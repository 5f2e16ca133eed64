"""Two disjoint process sets side by side: does one set's allreduce wait for the other set?

    python benchmarks/process_sets.py [--ops 40] [--backend gloo|shm|auto]

4 ranks, sets A = [0, 1] and B = [2, 3]. Each set times ``--ops`` synchronous 1 KB allreduces
and ``--ops // 2`` synchronous 1 MB allreduces through the engine, in three situations:

1. ``other_waiting``: the other set's ranks wait in a global barrier (their engines cycle);
2. ``other_stalled``: the other set's ranks compute (sleep) and submit nothing, so their
   engines only wake at the idle tick (1 s). With one global negotiation per cycle instead of a
   controller per set, every cycle of the measuring set would wait for that tick;
3. ``both_busy``: both sets run their allreduces at the same time (on this 2-core machine the
   4 ranks also share the cores, so some slow-down is the CPU's, not the engine's).

Prints ms per op and writes benchmarks/results/process_sets.json. Run it against another tree
with PYTHONPATH=<that tree>/src to compare the two in one session.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

from recording import record

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "process_sets.json")
STALL_S = 4.0  # how long the stalled set computes: longer than the other set's run here


def _worker(ops: int) -> dict:
    import torch

    import accord
    from accord.engine import session

    torch.set_num_threads(1)
    session.init()
    rank = session.topology().rank
    a = session.add_process_set([0, 1])
    b = session.add_process_set([2, 3])
    mine, name = (a, "A") if rank < 2 else (b, "B")
    small, big = torch.ones(256), torch.ones(256 * 1024)

    def run_ops(tag: str) -> dict[str, float]:
        out = {}
        for label, tensor, count in (("1KB", small, ops), ("1MB", big, max(ops // 2, 1))):
            start = time.perf_counter()
            for _i in range(count):
                session.synchronize(session.submit("allreduce", tensor, f"{tag}.{label}", in_place=True,
                                                   process_set_id=mine))
            out[f"{label}_ms_per_op"] = round((time.perf_counter() - start) * 1e3 / count, 3)
        return out

    def barrier() -> None:
        session.synchronize(session.submit("barrier", None, None))

    results: dict[str, dict] = {}
    run_ops("warmup")
    barrier()
    for measuring in ("A", "B"):
        # 1. the other set waits in a global barrier
        if name == measuring:
            results[f"{measuring}_other_waiting"] = run_ops("w")
        barrier()
        # 2. the other set computes and submits nothing
        if name == measuring:
            results[f"{measuring}_other_stalled"] = run_ops("s")
        else:
            time.sleep(STALL_S)
        barrier()
    # 3. both sets at once
    results[f"{name}_both_busy"] = run_ops("b")
    barrier()
    session.shutdown()
    return {"rank": rank, "results": results, "version": getattr(accord, "__version__", "?"),
            "source": os.path.dirname(accord.__file__)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=40)
    parser.add_argument("--backend", default="gloo", help="engine CPU backend: gloo (default), shm or auto")
    parser.add_argument("--out", default=RESULTS, help="where to write the JSON result")
    args = parser.parse_args(argv)
    os.environ["ACCORD_CPU_BACKEND"] = args.backend  # inherited by the spawned ranks
    from accord.run.functions.spawn import spawn

    per_rank = spawn(_worker, args=(args.ops,), nprocs=4)
    merged: dict[str, dict] = {}
    for r in per_rank:
        if r["rank"] in (0, 2):  # one member per set reports (members time the same ops)
            merged.update(r["results"])
    import torch

    result = {
        "timings": merged,
        "ratios": {
            f"{s}_stalled_vs_waiting_1KB": round(merged[f"{s}_other_stalled"]["1KB_ms_per_op"]
                                                 / merged[f"{s}_other_waiting"]["1KB_ms_per_op"], 3)
            for s in ("A", "B")},
        "environment": {"torch": torch.__version__, "python": platform.python_version(), "world_size": 4,
                        "sets": [[0, 1], [2, 3]], "engine_backend": args.backend, "cpus": os.cpu_count(),
                        "ops": args.ops, "stall_s": STALL_S, "accord_source": per_rank[0]["source"]},
    }
    record(result, args.out, "process_sets.py", argv)
    print(f"{'case':<20} {'1KB ms/op':>10} {'1MB ms/op':>10}")
    for case, t in sorted(merged.items()):
        print(f"{case:<20} {t['1KB_ms_per_op']:10.2f} {t['1MB_ms_per_op']:10.2f}")
    for k, v in result["ratios"].items():
        print(f"{k}: {v}")
    print(f"median 1KB ms/op over cases: {statistics.median(t['1KB_ms_per_op'] for t in merged.values()):.2f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
