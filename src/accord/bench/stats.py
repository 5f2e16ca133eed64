"""The benchmark harness's arithmetic: bandwidths, throughput statistics, efficiency, ratios.

Pure Python (no torch, no numpy) so it is cheap to import and easy to check by hand.

Bandwidth follows NCCL-tests (``doc/PERFORMANCE.md`` there): ``algbw = size / time`` and
``busbw = algbw * factor(op, n)``, where ``size`` is the full buffer of the operation: the
tensor reduced by allreduce/reduce, broadcast's tensor, the *gathered* output of allgather (n
ranks' inputs), the *input* of reduce_scatter (n ranks' outputs) and one rank's whole send buffer
for alltoall. Bus bandwidth is comparable across rank counts and with the hardware's peak.

Spread is reported as Horovod's and NVIDIA's benchmarks do: ``mean +- 1.96 * stdev`` over the
measured iterations (sample standard deviation), plus median, min and max.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

__all__ = [
    "Summary", "algbw", "bus_factor", "busbw", "format_size", "known_ops", "mean_ci", "parse_size",
    "ratio", "ratios", "scaling_efficiency", "size_sweep", "speedup", "summarize", "throughput",
]

GB = 1e9  # NCCL-tests' GB/s are decimal

_ALIASES = {
    "allreduce": "allreduce", "all_reduce": "allreduce",
    "allgather": "allgather", "all_gather": "allgather",
    "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce",
    "alltoall": "alltoall", "all_to_all": "alltoall",
}


def known_ops() -> list[str]:
    """Collective names :func:`bus_factor` understands (canonical spellings)."""
    return sorted(set(_ALIASES.values()))


def bus_factor(op: str, nranks: int) -> float:
    """NCCL-tests' busbw / algbw factor of ``op`` on ``nranks`` ranks.

    allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall (n-1)/n; broadcast, reduce 1.
    """
    canonical = _ALIASES.get(op.lower()) if isinstance(op, str) else None
    if canonical is None:
        raise ValueError(
            f"unknown collective {op!r}; known: {known_ops()}.\n"
            "HINT: use one of the known names (aliases like all_reduce are accepted)."
        )
    if isinstance(nranks, bool) or not isinstance(nranks, int) or nranks < 1:
        raise ValueError(f"nranks must be an int >= 1; got {nranks!r}.\nHINT: pass the world size.")
    n = nranks
    if canonical == "allreduce":
        return 2 * (n - 1) / n
    if canonical in ("allgather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def _positive_time(seconds: float) -> float:
    if not seconds > 0 or not math.isfinite(seconds):
        raise ValueError(
            f"a duration must be finite and > 0 seconds; got {seconds!r}.\n"
            "HINT: time more iterations so the measured time is not zero."
        )
    return float(seconds)


def algbw(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes/s): ``size_bytes / seconds``."""
    return size_bytes / _positive_time(seconds) / GB


def busbw(op: str, size_bytes: float, seconds: float, nranks: int) -> float:
    """Bus bandwidth in GB/s: ``algbw * bus_factor(op, nranks)``."""
    return algbw(size_bytes, seconds) * bus_factor(op, nranks)


def throughput(samples: float, seconds: float) -> float:
    """Samples (images, tokens, rounds) per second."""
    return samples / _positive_time(seconds)


def scaling_efficiency(throughput_n: float, throughput_1: float, n: int) -> float:
    """``throughput(N) / (N * throughput(1))``: 1.0 is perfect linear scaling."""
    if n < 1 or not throughput_1 > 0:
        raise ValueError(
            f"scaling efficiency needs n >= 1 and a positive 1-process throughput; "
            f"got n={n}, throughput_1={throughput_1}.\n"
            "HINT: measure the single-process run in the same invocation first."
        )
    return throughput_n / (n * throughput_1)


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, refusing a zero denominator with a clear error."""
    if denominator == 0:
        raise ValueError(
            f"cannot take the ratio {numerator!r} / 0.\n"
            "HINT: the baseline measurement is zero; check that it ran and was timed."
        )
    return numerator / denominator


def speedup(value: float, baseline: float, higher_is_better: bool = True) -> float:
    """How many times better ``value`` is than ``baseline``.

    Throughputs (``higher_is_better=True``): value / baseline. Times (False): baseline / value.
    """
    return ratio(value, baseline) if higher_is_better else ratio(baseline, value)


def ratios(values: Mapping[Hashable, float], baselines: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """Per-key ``values[k] / baselines[k]`` for keys present in both (e.g. per message size)."""
    return {k: ratio(values[k], baselines[k]) for k in values if k in baselines}


def mean_ci(values: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """``(mean, z * sample stdev)``; the half-width is NaN for a single value (spread unknown)."""
    data = [float(v) for v in values]
    if not data:
        raise ValueError("no values to summarise.\nHINT: run at least one measured iteration after warm-up.")
    mean = statistics.fmean(data)
    half = z * statistics.stdev(data) if len(data) > 1 else math.nan
    return mean, half


@dataclass(frozen=True)
class Summary:
    """Statistics of one series of measurements."""

    n: int
    mean: float
    stdev: float  # sample standard deviation (NaN when n == 1)
    ci95: float  # 1.96 * stdev: report as mean +- ci95
    median: float
    min: float
    max: float

    def __str__(self) -> str:
        return (f"{self.mean:.4g} +-{self.ci95:.2g} (median {self.median:.4g}, "
                f"min {self.min:.4g}, max {self.max:.4g}, n={self.n})")


def summarize(values: Sequence[float]) -> Summary:
    """Mean, sample stdev, 1.96-sigma half-width, median, min and max of ``values``."""
    data = [float(v) for v in values]
    mean, half = mean_ci(data)
    stdev = statistics.stdev(data) if len(data) > 1 else math.nan
    return Summary(len(data), mean, stdev, half, statistics.median(data), min(data), max(data))


_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024 ** 2, "MB": 1024 ** 2,
          "MIB": 1024 ** 2, "G": 1024 ** 3, "GB": 1024 ** 3, "GIB": 1024 ** 3}


def parse_size(text: str | int) -> int:
    """Bytes in ``text`` such as "4", "4B", "64K", "1MB", "2GiB" (binary units, as NCCL-tests)."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"cannot read a size from {text!r}.\n"
            "HINT: write a number with an optional unit B, K/KB, M/MB or G/GB, e.g. 64MB."
        )
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(size_bytes: int) -> str:
    """Short binary-unit label: 4 -> "4B", 65536 -> "64KB", 1048576 -> "1MB"."""
    for unit, scale in (("GB", 1024 ** 3), ("MB", 1024 ** 2), ("KB", 1024)):
        if size_bytes >= scale and size_bytes % scale == 0:
            return f"{size_bytes // scale}{unit}"
    if size_bytes >= 1024:
        return f"{size_bytes / 1024:.1f}KB" if size_bytes < 1024 ** 2 else f"{size_bytes / 1024 ** 2:.1f}MB"
    return f"{size_bytes}B"


def size_sweep(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """Sizes ``min, min*factor, ...`` up to and including ``max`` (``max`` added if skipped)."""
    if min_bytes < 1 or max_bytes < min_bytes or factor < 2:
        raise ValueError(
            f"bad size sweep: min={min_bytes}, max={max_bytes}, factor={factor}.\n"
            "HINT: need 1 <= min <= max and an integer factor >= 2, e.g. 4B .. 256MB by 2."
        )
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    if sizes[-1] != max_bytes:
        sizes.append(max_bytes)
    return sizes
