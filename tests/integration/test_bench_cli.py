"""accord-bench end to end on 2 real ranks, with tiny sizes and few steps.

Every number in the JSON is re-derived here from the raw timings it also records (bus
bandwidth, ratios, efficiency, speedup), and accord's training is checked against the
baseline's: the same seeds and data give the same losses when gradients are averaged right.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _bench(*argv: str, timeout: float = 80) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "accord.bench", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.mark.timeout(90)
def test_collectives_on_two_ranks_against_raw(tmp_path):
    out, png = tmp_path / "c.json", tmp_path / "c.png"
    extra = ["--plot", str(png)] if HAS_MATPLOTLIB else []
    proc = _bench("collectives", "--nproc-per-node", "2", "--ops", "allreduce,all_gather",
                  "--sizes", "4,64K", "--iters", "3", "--warmup", "1", "--compare", "raw",
                  "--backends", "gloo", "--json", str(out), *extra)
    assert "# allreduce · float32 · gloo (engine) · 2 ranks · vs raw torch.distributed" in proc.stdout
    assert "# allgather · float32 · gloo (engine) · 2 ranks" in proc.stdout
    result = json.loads(out.read_text())
    assert result["kind"] == "collectives" and result["launcher"] == "spawn"
    assert result["command"].startswith("accord-bench collectives --nproc-per-node 2")
    assert len(result["load_average_before"]) == 3
    env = result["environment"]
    assert env["world_size"] == 2 and env["threads_per_rank"] == max(1, (os.cpu_count() or 1) // 2)
    assert [(s["op"], s["backend"], s["api"]) for s in result["series"]] == [
        ("allreduce", "gloo", "engine"), ("allgather", "gloo", "engine")]
    # NCCL-tests sizes: allgather's 4 B become one float32 per rank, 8 B gathered
    sizes = {s["op"]: [r["size_bytes"] for r in s["rows"]] for s in result["series"]}
    assert sizes == {"allreduce": [4, 65536], "allgather": [8, 65536]}
    factors = {"allreduce": 2 * (2 - 1) / 2, "allgather": (2 - 1) / 2}
    for s in result["series"]:
        for r in s["rows"]:
            assert r["verified"] is True and r["iterations"] == 3
            t = r["time_us"]
            assert 0 < t["min"] <= t["median"] <= t["max"]
            algbw = r["size_bytes"] / (t["median"] * 1e-6) / 1e9
            assert r["algbw_gbps"]["median"] == pytest.approx(algbw)
            assert r["busbw_gbps"]["median"] == pytest.approx(algbw * factors[s["op"]])
            assert r["busbw_gbps"]["max"] == pytest.approx(r["size_bytes"] / (t["min"] * 1e-6) / 1e9 * factors[s["op"]])
            assert r["ratio"] == pytest.approx(r["raw"]["time_us"]["median"] / t["median"])
    if HAS_MATPLOTLIB:
        assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.timeout(120)
def test_train_on_two_ranks_against_ddp(tmp_path):
    out, png = tmp_path / "t.json", tmp_path / "t.png"
    extra = ["--plot", str(png)] if HAS_MATPLOTLIB else []
    proc = _bench("train", "--model", "lenet", "--nproc-per-node", "2", "--batch-size", "8",
                  "--steps", "2", "--warmup", "1", "--log-interval", "2", "--baseline", "ddp",
                  "--repeats", "2", "--json", str(out), *extra, timeout=110)
    for label in ("single", "accord", "ddp"):
        for repeat in (1, 2):
            assert f"[{label} #{repeat}] step    2/3  loss " in proc.stdout
    assert "[accord #1] step    1/3 (warm-up)" in proc.stdout
    # repeats alternate the order of accord and the baseline
    order = [line.split()[0] for line in proc.stdout.splitlines() if "step    3/3" in line]
    assert order == ["[single", "[accord", "[ddp", "[single", "[ddp", "[accord"]
    result = json.loads(out.read_text())
    runs = {r["name"]: r for r in result["runs"]}
    assert [r["name"] for r in result["runs"]] == ["single", "accord", "ddp"]
    assert [runs[n]["world_size"] for n in runs] == [1, 2, 2]
    assert all(r["steps"] == 4 and r["repeats"] == 2 and r["peak_memory_mb"] > 0
               and r["memory_kind"] == "rss" for r in runs.values())
    # accord (engine averaging) and DDP train the same model on the same data: same losses
    acc, ddp = dict(map(tuple, runs["accord"]["losses"])), dict(map(tuple, runs["ddp"]["losses"]))
    assert sorted(acc) == [1, 2, 3]
    for step, loss in acc.items():
        assert loss == pytest.approx(ddp[step], rel=1e-4, abs=1e-5)
    one = runs["single"]["throughput"]
    assert one == pytest.approx(8 * 4 / (runs["single"]["step_ms"]["mean"] * 4 / 1e3))
    for name in ("accord", "ddp"):
        assert runs[name]["efficiency"] == pytest.approx(runs[name]["throughput"] / (2 * one))
    speedup = runs["accord"]["throughput"] / runs["ddp"]["throughput"]
    assert runs["accord"]["speedup_vs_baseline"] == pytest.approx(speedup)
    assert f"# accord vs ddp: {runs['accord']['speedup_vs_baseline']:.2f}x" in proc.stdout
    if HAS_MATPLOTLIB:
        assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.timeout(120)
def test_train_digits_o1_against_horovod_style(tmp_path):
    out = tmp_path / "t.json"
    proc = _bench("train", "--model", "lenet", "--data", "digits", "--amp-level", "O1",
                  "--nproc-per-node", "2", "--batch-size", "16", "--steps", "3", "--warmup", "1",
                  "--log-interval", "4", "--baseline", "horovod-style", "--json", str(out), timeout=110)
    assert "# accord-bench train · lenet · 8x8 digits data · batch 16/rank · amp O1" in proc.stdout
    runs = {r["name"]: r for r in json.loads(out.read_text())["runs"]}
    assert list(runs) == ["single", "accord", "horovod-style"]
    assert runs["accord"]["compute_dtype"] == "bfloat16"
    acc, base = runs["accord"]["losses"], runs["horovod-style"]["losses"]
    assert [s for s, _ in acc] == [s for s, _ in base] == [1, 4]
    for (_, a), (_, b) in zip(acc, base):
        assert a == pytest.approx(b, rel=1e-3)
    assert 1.5 < acc[0][1] < 3.0  # about ln(10) = 2.30 for an untrained 10-class model


@pytest.mark.timeout(120)
def test_train_accord_via_ddp_on_the_accord_backend(tmp_path):
    out = tmp_path / "t.json"
    proc = _bench("train", "--model", "lenet", "--nproc-per-node", "2", "--batch-size", "8",
                  "--steps", "2", "--warmup", "1", "--log-interval", "1", "--baseline", "ddp",
                  "--accord-api", "ddp", "--json", str(out), timeout=110)
    assert "accord via DDP on the accord backend" in proc.stdout
    result = json.loads(out.read_text())
    assert result["config"]["accord_api"] == "ddp"
    runs = {r["name"]: r for r in result["runs"]}
    assert runs["accord"]["strategy"] == "accord-ddp" and runs["ddp"]["strategy"] == "ddp"
    # DDP on the accord backend and DDP on gloo: the same averaging, so the same losses
    acc, ddp = dict(map(tuple, runs["accord"]["losses"])), dict(map(tuple, runs["ddp"]["losses"]))
    assert sorted(acc) == [1, 2, 3]
    for step, loss in acc.items():
        assert loss == pytest.approx(ddp[step], rel=1e-5, abs=1e-6)


def test_train_accord_via_ddp_refuses_compression():
    proc = subprocess.run([sys.executable, "-m", "accord.bench", "train", "--accord-api", "ddp",
                           "--compression", "bf16"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--compression bf16 applies to --accord-api hvd" in proc.stderr and "HINT:" in proc.stderr


@pytest.mark.timeout(90)
def test_collectives_under_accordrun():
    proc = subprocess.run(
        [sys.executable, "-m", "accord.run", "-np", "2", sys.executable, "-m", "accord.bench",
         "collectives", "--sizes", "4", "--iters", "2", "--warmup", "1", "--backends", "gloo",
         "--api", "comm"],
        cwd=ROOT, capture_output=True, text=True, timeout=80)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = [line for line in proc.stdout.splitlines() if "# allreduce · float32 · gloo (comm)" in line]
    assert table == ["[0]<stdout>:# allreduce · float32 · gloo (comm) · 2 ranks"]  # rank 0 reports, once
    assert "[1]<stdout>:" not in proc.stdout
    assert "world size 2 · backend gloo" in proc.stdout


@pytest.mark.timeout(60)
def test_train_one_process_o2(tmp_path):
    out = tmp_path / "t.json"
    proc = _bench("train", "--model", "lenet", "--nproc-per-node", "1", "--threads", "1",
                  "--amp-level", "O2", "--batch-size", "4", "--steps", "2", "--warmup", "1",
                  "--baseline", "none", "--json", str(out), timeout=50)
    assert "world size 1 · backend gloo · threads/rank 1" in proc.stdout
    result = json.loads(out.read_text())
    (run,) = result["runs"]
    assert run["name"] == "single" and run["world_size"] == 1 and run["steps"] == 2
    assert run["compute_dtype"] == "bfloat16" and run["efficiency"] == pytest.approx(1.0)
    assert run["speedup_vs_baseline"] is None
    assert "vs baseline" in proc.stdout and "# accord vs" not in proc.stdout
