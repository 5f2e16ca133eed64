"""Benchmark arithmetic, checked against numbers worked out by hand."""
from __future__ import annotations

import math

import pytest

from accord.bench import stats

pytestmark = pytest.mark.timeout(10)


def test_bus_factors():
    assert stats.bus_factor("allreduce", 2) == 1.0  # 2*(2-1)/2
    assert stats.bus_factor("allreduce", 4) == 1.5  # 2*3/4
    assert stats.bus_factor("all_reduce", 8) == 1.75
    assert stats.bus_factor("allgather", 4) == 0.75
    assert stats.bus_factor("reducescatter", 2) == 0.5
    assert stats.bus_factor("reduce_scatter", 8) == 0.875
    assert stats.bus_factor("alltoall", 4) == 0.75
    assert stats.bus_factor("broadcast", 8) == 1.0
    assert stats.bus_factor("reduce", 3) == 1.0
    assert stats.bus_factor("allreduce", 1) == 0.0  # one rank moves nothing over the bus
    with pytest.raises(ValueError, match=r"(?s)unknown collective 'gather'; known: \[.*HINT:"):
        stats.bus_factor("gather", 2)
    with pytest.raises(ValueError, match="nranks"):
        stats.bus_factor("allreduce", 0)


def test_bandwidths():
    # 64 MiB in 37 ms: 67,108,864 B / 0.037 s = 1.8137530810810812 GB/s
    assert stats.algbw(64 * 2**20, 0.037) == pytest.approx(1.8137530810810812)
    # allreduce on 4 ranks: busbw = algbw * 1.5; 1e9 B in 2 s -> 0.5 GB/s -> 0.75
    assert stats.busbw("allreduce", 1e9, 2.0, 4) == pytest.approx(0.75)
    assert stats.busbw("allgather", 8e9, 4.0, 2) == pytest.approx(1.0)  # 2 GB/s * 1/2
    assert stats.busbw("broadcast", 3e9, 1.5, 16) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="HINT:"):
        stats.algbw(10, 0.0)
    with pytest.raises(ValueError):
        stats.algbw(10, float("nan"))


def test_throughput_efficiency_ratios():
    assert stats.throughput(512, 4.0) == 128.0
    # measured: 1 process 617 ms/step vs DDP 737 ms/step on 2 ranks, batch 16/rank
    one = stats.throughput(16, 0.617)
    two = stats.throughput(32, 0.737)
    assert stats.scaling_efficiency(two, one, 2) == pytest.approx(617 / 737)
    assert stats.scaling_efficiency(300.0, 100.0, 4) == 0.75
    with pytest.raises(ValueError, match="HINT:"):
        stats.scaling_efficiency(1.0, 0.0, 2)
    assert stats.ratio(3.0, 4.0) == 0.75
    with pytest.raises(ValueError, match="HINT:"):
        stats.ratio(1.0, 0)
    assert stats.speedup(120.0, 100.0) == 1.2  # throughputs
    assert stats.speedup(0.5, 1.0, higher_is_better=False) == 2.0  # times
    assert stats.ratios({4: 2.0, 8: 3.0, 16: 1.0}, {4: 1.0, 8: 4.0}) == {4: 2.0, 8: 0.75}


def test_mean_ci_and_summary():
    values = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]
    # mean 5; squared deviations 9+1+1+1+0+0+4+16 = 32; sample variance 32/7; stdev 2.13808994
    mean, half = stats.mean_ci(values)
    assert mean == 5.0
    assert half == pytest.approx(1.96 * math.sqrt(32 / 7))
    assert half == pytest.approx(4.190656, rel=1e-6)
    s = stats.summarize(values)
    assert (s.n, s.mean, s.median, s.min, s.max) == (8, 5.0, 4.5, 2.0, 9.0)
    assert s.stdev == pytest.approx(2.1380899)
    assert s.ci95 == pytest.approx(half)
    assert str(s).startswith("5 +-4.2 (median 4.5")
    assert stats.summarize([3, 1, 2]).median == 2.0
    one = stats.summarize([7.0])
    assert one.mean == 7.0 and math.isnan(one.ci95) and math.isnan(one.stdev)
    with pytest.raises(ValueError, match="HINT:"):
        stats.mean_ci([])


def test_sizes():
    assert stats.parse_size("4") == 4
    assert stats.parse_size("4B") == 4
    assert stats.parse_size("64K") == 65536
    assert stats.parse_size("1MB") == 1048576
    assert stats.parse_size("256mb") == 256 * 2**20
    assert stats.parse_size("2GiB") == 2 * 2**30
    assert stats.parse_size("1.5K") == 1536
    assert stats.parse_size(12) == 12
    with pytest.raises(ValueError, match="HINT:"):
        stats.parse_size("10 parsecs")
    assert stats.format_size(4) == "4B"
    assert stats.format_size(65536) == "64KB"
    assert stats.format_size(256 * 2**20) == "256MB"
    assert stats.format_size(1536) == "1.5KB"
    assert stats.size_sweep(4, 64) == [4, 8, 16, 32, 64]
    assert stats.size_sweep(4, 100, factor=4) == [4, 16, 64, 100]
    assert stats.size_sweep(8, 8) == [8]
    with pytest.raises(ValueError, match="HINT:"):
        stats.size_sweep(8, 4)
