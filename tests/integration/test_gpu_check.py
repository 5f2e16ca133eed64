"""scripts/gpu_check.sh and its helpers on a machine without a GPU (what CI has).

- the script says there is no GPU, runs nothing, writes nothing and exits 0;
- benchmarks/gpu_bench.py runs its collectives part end to end on the CPU (--quick) and
  gathers the accord-bench JSON into its own;
- benchmarks/gpu_summary.py turns test XML + benchmark JSON into the summary, counting
  failures and skips from the XML and reporting missing inputs as missing.
On a GPU machine the real thing runs through the script itself (tests/gpu).
"""
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks")

pytestmark = pytest.mark.timeout(240)  # generous: a loaded 2-core machine starts torch slowly


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the script would run everything")
def test_script_without_a_gpu_runs_nothing_and_exits_0():
    results = os.path.join(ROOT, "benchmarks", "results", "gpu")
    before = sorted(os.listdir(results)) if os.path.isdir(results) else None
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "ACCORD_GPU_PYTHON")}
    env["ACCORD_GPU_PYTHON"] = sys.executable  # this interpreter's torch: no device here
    done = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_check.sh")], capture_output=True,
                          text=True, timeout=100, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no CUDA GPU visible here" in done.stdout and "nothing run" in done.stdout, done.stdout
    after = sorted(os.listdir(results)) if os.path.isdir(results) else None
    assert after == before  # nothing written


def _run(script, *args, timeout=220):
    return subprocess.run([sys.executable, os.path.join(BENCH, script), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_gpu_bench_collectives_part_on_the_cpu(tmp_path):
    done = _run("gpu_bench.py", "--device", "cpu", "--quick", "--parts", "allreduce", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_bench.json").read_text())
    part = result["allreduce"]
    assert part["ok"] and part["json"] == "allreduce_1rank.json"
    assert [(r["backend"], r["size_bytes"]) for r in part["rows"]] == [("gloo", 4), ("gloo", 1024), ("gloo", 65536)]
    for row in part["rows"]:  # engine and raw both measured, overhead is their difference
        assert row["accord_us"] > 0 and row["raw_us"] > 0 and row["world_size"] == 1
        assert row["overhead_us"] == pytest.approx(row["accord_us"] - row["raw_us"])
        assert row["busbw_gbps"] == 0.0  # one rank: NCCL-tests' bus factor is 0
    assert result["command"].startswith("python benchmarks/gpu_bench.py")


_XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="3" time="12.5">
<testcase classname="tests.gpu.test_gpu_one_rank" name="test_a" time="3.0"/>
<testcase classname="tests.gpu.test_gpu_one_rank" name="test_b" time="4.0">
<failure message="AssertionError: 1 failures: rank 0 allreduce sum bfloat16: got [1.0]">trace</failure></testcase>
<testcase classname="tests.gpu.test_gpu_shared" name="test_c" time="0.0">
<skipped type="pytest.skip" message="needs a real GPU">skip</skipped></testcase>
<testcase time="0.000" />
</testsuite></testsuites>
"""


def _bench_result():
    run = {"ok": True, "batch_size": 256, "step_ms_median": 80.0, "peak_memory_mb": 20000.0,
           "memory_kind": "cuda_max_allocated", "compile_warmup_s": None}
    return {"kind": "gpu_bench", "resnet": {
        "model": "resnet50", "image_size": 224, "steps": 20, "warmup": 3,
        "runs": {"O0": {**run, "images_per_s": 1200.0}, "O1": {**run, "images_per_s": 2600.0},
                 "O1_compiled": {**run, "images_per_s": 3100.0, "compile_warmup_s": 70.0}},
        "amp_compile_vs_eager_fp32": 3100.0 / 1200.0,
        "targets": {"amp_compile_images_per_s": 3000.0, "speedup_vs_eager_fp32": 1.5,
                    "images_per_s_met": True, "speedup_met": True}},
        "allreduce": {"ok": False, "error": "timed out after 40s"}}


def test_summary_counts_the_xml_and_shows_the_benchmarks(tmp_path):
    (tmp_path / "pytest_gpu.xml").write_text(_XML)
    (tmp_path / "gpu_bench.json").write_text(json.dumps(_bench_result()))
    (tmp_path / "environment.json").write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0"}))
    done = _run("gpu_summary.py", "--out", str(tmp_path), "--seconds", "512")
    assert done.returncode == 1, done.stdout + done.stderr  # a test failed
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    tests = summary["tests"]
    assert (tests["tests"], tests["passed"], tests["failed"], tests["skipped"]) == (3, 1, 1, 1)
    assert tests["failures"][0]["test"] == "tests.gpu.test_gpu_one_rank::test_b"
    md = (tmp_path / "gpu_check.md").read_text()
    assert "1 passed, 1 failed, 0 errors, 1 skipped" in md
    assert tests["interrupted"] and "stopped at the time limit" in md  # the nameless last case
    assert "| O1_compiled | 256 | 3,100.0 |" in md and "2.58x" in md and "met" in md
    assert "failed: timed out after 40s" in md and "NVIDIA H100 80GB HBM3" in md


def test_summary_reports_missing_inputs_as_missing(tmp_path):
    done = _run("gpu_summary.py", "--out", str(tmp_path))
    assert done.returncode == 1
    md = (tmp_path / "gpu_check.md").read_text()
    assert "gpu tests: no result" in md and "benchmarks: no result" in md
