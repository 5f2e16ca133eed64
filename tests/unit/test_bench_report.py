"""accord-bench's result arithmetic and formatting, against numbers worked out by hand."""
from __future__ import annotations

import json
import sys

import pytest

from accord.bench import report, results
from accord.errors import ConfigError

pytestmark = pytest.mark.timeout(30)

MiB = 1024 * 1024


def test_message_shape_follows_nccl_tests_sizes():
    # allreduce / broadcast: the whole buffer; 1 MiB of float32 = 262144 elements
    assert results.message_shape("allreduce", MiB, 4, 2) == (262144, MiB)
    assert results.message_shape("broadcast", 10, 4, 3) == (2, 8)  # rounded down to whole elements
    assert results.message_shape("allreduce", 2, 8, 2) == (1, 8)  # at least one element
    # allgather: size is the gathered output; each of 4 ranks sends 1/4
    assert results.message_shape("allgather", MiB, 4, 4) == (65536, MiB)
    assert results.message_shape("allgather", 4, 4, 2) == (1, 8)  # one element per rank at least
    # reduce-scatter / alltoall: the input, a multiple of n elements
    assert results.message_shape("reducescatter", 1000, 4, 3) == (249, 996)
    assert results.message_shape("alltoall", 4, 4, 2) == (2, 8)


def test_bandwidth_row_numbers():
    # allreduce of 1 MiB on 2 ranks (bus factor 2*(2-1)/2 = 1); times 1, 2, 4 ms
    row = results.bandwidth_row("allreduce", MiB, 262144, 2, [0.004, 0.001, 0.002],
                                raw_seconds=[0.001, 0.001, 0.003], verified=True)
    assert row["size_bytes"] == MiB and row["count"] == 262144 and row["iterations"] == 3
    assert row["time_us"] == pytest.approx({"median": 2000.0, "min": 1000.0, "max": 4000.0})
    # algbw = 1048576 B / 0.002 s / 1e9 = 0.524288 GB/s; min from the slowest (4 ms), max from 1 ms
    assert row["algbw_gbps"] == pytest.approx({"median": 0.524288, "min": 0.262144, "max": 1.048576})
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"])
    assert row["raw"]["time_us"]["median"] == pytest.approx(1000.0)
    assert row["ratio"] == pytest.approx(0.5)  # raw 1 ms vs accord 2 ms: accord at half the busbw
    assert row["verified"] is True

    # allgather on 4 ranks: busbw = algbw * 3/4
    row = results.bandwidth_row("allgather", 4_000_000, 250_000, 4, [0.01])
    assert row["algbw_gbps"]["median"] == pytest.approx(0.4)
    assert row["busbw_gbps"]["median"] == pytest.approx(0.3)
    assert row["raw"] is None and row["ratio"] is None and row["verified"] is None


def test_train_run_and_comparison():
    # 1 process, batch 16: steps of 0.5 s and 1.0 s -> 32 samples in 1.5 s = 21.333 samples/s
    single = results.train_run("single", 1, 16, [0.5, 1.0], peak_memory_mb=100.0)
    assert single["throughput"] == pytest.approx(32 / 1.5)
    # per-step rates 32 and 16 samples/s: mean 24, sample stdev 11.3137, ci 1.96 * that
    assert single["samples_per_s"]["mean"] == pytest.approx(24.0)
    assert single["samples_per_s"]["ci95"] == pytest.approx(1.96 * 11.313708498984761)
    assert single["step_ms"]["median"] == pytest.approx(750.0)
    assert single["peak_memory_mb"] == 100.0
    # 2 ranks, batch 16 each: 0.8 s steps -> 40 samples/s in all, 20 per device
    accord = results.train_run("accord", 2, 16, [0.8, 0.8, 0.8])
    ddp = results.train_run("ddp", 2, 16, [1.0, 1.0, 1.0])
    assert accord["throughput"] == pytest.approx(40.0)
    assert accord["samples_per_s_per_device"] == pytest.approx(20.0)
    assert accord["samples_per_s"]["ci95"] == pytest.approx(0.0)
    runs = [single, accord, ddp]
    results.compare_runs(runs, "single", "ddp")
    # efficiency = 40 / (2 * 21.333) = 0.9375; ddp 32 / 42.667 = 0.75
    assert accord["efficiency"] == pytest.approx(0.9375)
    assert ddp["efficiency"] == pytest.approx(0.75)
    assert single["efficiency"] == pytest.approx(1.0)
    assert accord["speedup_vs_baseline"] == pytest.approx(1.25)
    assert ddp["speedup_vs_baseline"] == pytest.approx(1.0)
    assert single["speedup_vs_baseline"] is None  # different world size: not comparable
    one = [results.train_run("single", 1, 8, [0.1])]
    results.compare_runs(one, "single", None)
    assert one[0]["samples_per_s"]["ci95"] is None  # spread unknown with one step
    assert one[0]["speedup_vs_baseline"] is None


def _env():
    return {"accord": "0.1.0", "torch": "2.13.0", "python": "3.11.7", "numpy": "2.0", "cpu": "CPU X",
            "cpu_count": 2, "load_average": [1.5, 1.25, 1.0], "world_size": 2, "threads_per_rank": 1,
            "backend": "gloo", "device": "cpu"}


def _collectives_result():
    rows = [results.bandwidth_row("allreduce", 4, 1, 2, [0.0002], [0.0001], True),
            results.bandwidth_row("allreduce", MiB, 262144, 2, [0.002], [0.001], True)]
    return {"kind": "collectives", "environment": _env(), "load_average_before": [0.5, 0.5, 0.5],
            "config": {"iters": 1, "warmup": 0},
            "series": [{"backend": "gloo", "api": "engine", "op": "allreduce", "dtype": "float32",
                        "device": "cpu", "world_size": 2, "rows": rows}]}


def test_format_collectives_table():
    text = report.format_collectives(_collectives_result())
    lines = text.splitlines()
    assert "# accord 0.1.0 · torch 2.13.0 · python 3.11.7 · numpy 2.0" in lines
    assert "load before 0.50 0.50 0.50 · load after 1.50 1.25 1.00" in text
    assert "# allreduce · float32 · gloo (engine) · 2 ranks · vs raw torch.distributed" in text
    header = next(line for line in lines if line.lstrip().startswith("size"))
    assert "raw busbw" in header and "ratio" in header
    one_mb = next(line for line in lines if line.lstrip().startswith("1MB"))
    cells = one_mb.replace("[", " ").replace("]", " ").replace(",", " ").split()
    # size, count, time median/min/max, algbw, busbw median/min/max, raw us, raw busbw, ratio
    assert cells[:2] == ["1MB", "262144"]
    assert float(cells[2]) == pytest.approx(2000.0)
    assert float(cells[5]) == pytest.approx(0.5243, abs=1e-4)
    assert float(cells[-3]) == pytest.approx(1000.0)
    assert float(cells[-2]) == pytest.approx(1.0486, abs=1e-4)
    assert float(cells[-1]) == pytest.approx(0.5)
    assert any(line.lstrip().startswith("4B ") for line in lines)


def _train_result(baseline="ddp"):
    runs = [results.train_run("single", 1, 16, [0.5, 0.5], peak_memory_mb=300.0, memory_kind="rss"),
            results.train_run("accord", 2, 16, [0.625, 0.625], peak_memory_mb=310.0, memory_kind="rss",
                              compile_warmup_s=None),
            results.train_run(baseline, 2, 16, [0.78125, 0.78125], peak_memory_mb=320.0, memory_kind="rss")]
    results.compare_runs(runs, "single", baseline)
    return {"kind": "train", "environment": _env(), "runs": runs,
            "config": {"model": "resnet50", "image_size": 64, "data": "synthetic", "batch_size": 16,
                       "amp_level": "O0", "compiler_opt": False, "compression": "none", "steps": 2,
                       "warmup": 1, "baseline": baseline}}


def test_format_train_table():
    text = report.format_train(_train_result())
    lines = text.splitlines()
    assert lines[0].startswith("# accord-bench train · resnet50 · 64x64 synthetic data · batch 16/rank")
    accord = next(line for line in lines if line.startswith("accord "))
    cells = accord.split()
    # 32 samples / 0.625 s = 51.2 samples/s; 25.6 per device; efficiency 51.2 / (2 * 32) = 0.8;
    # ddp: 32 / 0.78125 = 40.96 samples/s, so accord is 1.25x and ddp's efficiency 0.64
    assert cells[1] == "2" and float(cells[2]) == pytest.approx(51.2)
    assert "25.60" in cells and "625.0" in cells and "0.80" in cells and cells[-1] == "1.25x"
    assert next(line for line in lines if line.startswith("ddp ")).split()[-1] == "1.00x"
    assert "# scaling efficiency on 2 ranks: accord 0.80, ddp 0.64" in text
    assert "# accord vs ddp: 1.25x samples/s" in text
    assert "peak RSS MB" in text


def test_json_round_trip(tmp_path):
    result = _train_result()
    path = tmp_path / "out.json"
    report.write_json(result, str(path))
    assert json.loads(path.read_text()) == json.loads(json.dumps(result))


def test_plot_without_matplotlib_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(ConfigError, match=r"(?s)--plot needs matplotlib.*HINT: pip install matplotlib"):
        report.check_plotting()


@pytest.mark.parametrize("kind", ["collectives", "train"])
def test_plot_writes_png(tmp_path, kind):
    pytest.importorskip("matplotlib")
    path = tmp_path / f"{kind}.png"
    report.plot(_collectives_result() if kind == "collectives" else _train_result(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
