"""Turn raw timings into the numbers the benchmark reports (pure Python, no torch).

- :func:`message_shape`: per-rank element count and the NCCL-tests size of one collective.
- :func:`bandwidth_row`: latency, algbw and busbw (median, min, max) of one size, plus the
  raw torch.distributed comparison and the ratio.
- :func:`train_run` and :func:`compare_runs`: samples/s (mean +- 1.96 sigma), per device,
  step time, scaling efficiency against the 1-process run and speedup over the baseline.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from accord.bench import stats


def message_shape(op: str, size_bytes: int, itemsize: int, nranks: int) -> tuple[int, int]:
    """``(elements per rank input, bytes the size really means)`` for a requested size.

    Sizes follow NCCL-tests: the whole buffer of allreduce/broadcast, the gathered output of
    allgather (each rank sends size/n), the input of reduce-scatter and one rank's send buffer
    of alltoall. Element counts are rounded down (to a multiple of n where the op splits the
    buffer across ranks, at least one element per rank), so the real size is reported too.
    """
    elements = max(1, size_bytes // itemsize)
    if op == "allgather":
        per_rank = max(1, elements // nranks)
        return per_rank, per_rank * nranks * itemsize
    if op in ("reducescatter", "alltoall"):
        count = max(nranks, elements // nranks * nranks)
        return count, count * itemsize
    return elements, elements * itemsize


def _spread(values: Sequence[float]) -> dict[str, float]:
    s = stats.summarize(values)
    return {"median": s.median, "min": s.min, "max": s.max}


def _bandwidths(op: str, size_bytes: int, nranks: int, seconds: Sequence[float]) -> dict[str, Any]:
    t = _spread(seconds)
    # The fastest iteration has the highest bandwidth: min/max swap between time and bandwidth.
    algbw = {"median": stats.algbw(size_bytes, t["median"]), "min": stats.algbw(size_bytes, t["max"]),
             "max": stats.algbw(size_bytes, t["min"])}
    factor = stats.bus_factor(op, nranks)
    return {
        "time_us": {k: v * 1e6 for k, v in t.items()},
        "algbw_gbps": algbw,
        "busbw_gbps": {k: v * factor for k, v in algbw.items()},
    }


def bandwidth_row(op: str, size_bytes: int, count: int, nranks: int, seconds: Sequence[float],
                  raw_seconds: Sequence[float] | None = None, verified: bool | None = None) -> dict[str, Any]:
    """One line of the collectives table.

    Args:
        seconds: per-iteration times (each the slowest rank's) of accord's collective.
        raw_seconds: the same for raw torch.distributed, measured interleaved, or None.
    Returns:
        ``size_bytes``, ``count``, ``time_us``/``algbw_gbps``/``busbw_gbps`` (each median, min,
        max), ``raw`` (the same three, or None) and ``ratio``: accord's median busbw over raw's
        (> 1: accord is faster), or None.
    """
    row: dict[str, Any] = {"size_bytes": size_bytes, "count": count, "iterations": len(seconds)}
    row.update(_bandwidths(op, size_bytes, nranks, seconds))
    row["raw"] = None if raw_seconds is None else _bandwidths(op, size_bytes, nranks, raw_seconds)
    row["ratio"] = None if raw_seconds is None else stats.ratio(row["raw"]["time_us"]["median"],
                                                                row["time_us"]["median"])
    row["verified"] = verified
    return row


def train_run(name: str, world_size: int, batch_size: int, step_seconds: Sequence[float],
              **extra: Any) -> dict[str, Any]:
    """Throughput of one measured training run.

    ``throughput`` is all samples of the timed steps over their total time (``world_size *
    batch_size * steps / sum(step times)``): the figure efficiency and speedup use, because a
    mean of per-step rates overweights the fastest steps. ``samples_per_s`` summarises the
    per-step rates as Horovod's benchmark does (mean +- 1.96 sigma, median, min, max);
    ``per_device`` is ``throughput / world_size``. ``extra`` (peak memory, compile time,
    losses...) is copied into the result.
    """
    per_step = [stats.throughput(world_size * batch_size, s) for s in step_seconds]
    overall = stats.throughput(world_size * batch_size * len(step_seconds), sum(step_seconds))
    step = stats.summarize([s * 1e3 for s in step_seconds])
    run: dict[str, Any] = {
        "name": name,
        "world_size": world_size,
        "batch_size": batch_size,
        "steps": len(step_seconds),
        "throughput": overall,
        "samples_per_s": _summary(stats.summarize(per_step)),
        "samples_per_s_per_device": overall / world_size,
        "step_ms": _summary(step),
    }
    run.update(extra)
    return run


def _summary(s: stats.Summary) -> dict[str, float | None]:
    def clean(x: float) -> float | None:
        return None if math.isnan(x) else x

    return {"mean": s.mean, "ci95": clean(s.ci95), "median": s.median, "min": s.min, "max": s.max,
            "n": s.n}


def compare_runs(runs: list[dict[str, Any]], single: str = "single", baseline: str | None = None) -> None:
    """Add ``efficiency`` (vs the 1-process run ``single``) and ``speedup_vs_baseline`` to every
    run of ``runs`` in place, both from the ``throughput`` of runs of the same invocation."""
    by_name = {r["name"]: r for r in runs}
    one = by_name.get(single)
    base = by_name.get(baseline) if baseline else None
    for r in runs:
        value = r["throughput"]
        r["efficiency"] = (stats.scaling_efficiency(value, one["throughput"], r["world_size"])
                           if one is not None else None)
        r["speedup_vs_baseline"] = (stats.speedup(value, base["throughput"])
                                    if base is not None and r["world_size"] == base["world_size"] else None)
