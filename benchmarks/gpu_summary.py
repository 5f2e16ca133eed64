"""The one JSON + short markdown that scripts/gpu_check.sh leaves in benchmarks/results/gpu/.

    python benchmarks/gpu_summary.py --out benchmarks/results/gpu [--seconds N]

Reads what the earlier steps wrote there: ``environment.json`` (the machine), ``pytest_gpu.xml``
(the ``gpu``-marked tests, JUnit XML) and ``gpu_bench.json`` (benchmarks/gpu_bench.py), and
writes ``gpu_check.json`` (all of it, plus the tests' pass/fail/skip counts and each failure's
first lines) and ``gpu_check.md`` (a table a person reads in a minute). A missing input is
reported as missing, never invented.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import xml.etree.ElementTree as ET
from typing import Any

from recording import record


def read_junit(path: str) -> dict[str, Any]:
    """Counts and failures of a pytest JUnit XML file (``{"missing": True}`` when absent)."""
    if not os.path.exists(path):
        return {"missing": True}
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    out: dict[str, Any] = {"tests": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0,
                           "interrupted": False, "seconds": 0.0, "failures": [], "skips": [], "cases": []}
    for suite in suites:
        out["seconds"] += float(suite.get("time", 0.0))
        for case in suite.iter("testcase"):
            if case.get("name") is None:  # the test running when pytest was interrupted
                out["interrupted"] = True
                continue
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            out["tests"] += 1
            state = "passed"
            for kind in ("failure", "error", "skipped"):
                node = case.find(kind)
                if node is not None:
                    state = {"failure": "failed", "error": "errors", "skipped": "skipped"}[kind]
                    text = (node.get("message") or node.text or "").strip()
                    if kind == "skipped":
                        out["skips"].append({"test": name, "reason": text[:300]})
                    else:
                        out["failures"].append({"test": name, "message": text[:1500]})
                    break
            out[state] += 1
            out["cases"].append({"test": name, "state": state, "seconds": float(case.get("time", 0.0))})
    return out


def _load(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh)


def _fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown(summary: dict[str, Any]) -> str:
    """The short human summary of :func:`build`'s result."""
    env = summary.get("environment") or {}
    tests = summary["tests"]
    lines = ["# GPU check", "",
             f"- machine: {env.get('gpu', '?')}, driver {env.get('driver', '?')}; torch {env.get('torch', '?')} "
             f"(CUDA {env.get('cuda', '?')}, NCCL {env.get('nccl', '?')}), Python {env.get('python', '?')}",
             f"- total time: {_fmt(summary.get('seconds'), 0)} s", ""]
    if tests.get("missing"):
        lines.append("**gpu tests: no result (pytest did not write its XML)**")
    else:
        lines.append(f"**gpu tests: {tests['passed']} passed, {tests['failed']} failed, {tests['errors']} errors, "
                     f"{tests['skipped']} skipped** in {_fmt(tests['seconds'], 0)} s")
        if tests["interrupted"]:
            lines.append("- **stopped at the time limit**: the tests after the last one listed did not run")
        lines += [f"- FAILED {f['test']}: {f['message'].splitlines()[0] if f['message'] else ''}"
                  for f in tests["failures"]]
        lines += [f"- skipped {s['test']}: {s['reason']}" for s in tests["skips"]]
    bench = summary.get("bench") or {}
    resnet = bench.get("resnet")
    if resnet:
        side = resnet["image_size"]
        lines += ["", f"## {resnet['model']} {side}x{side}, synthetic data, 1 GPU, NHWC",
                  "", "| run | batch | images/s | step ms (median) | peak GPU MB | compile warm-up s |",
                  "|---|---|---|---|---|---|"]
        for label, run in resnet["runs"].items():
            if run.get("ok"):
                lines.append(f"| {label} | {run['batch_size']} | {_fmt(run['images_per_s'])} | "
                             f"{_fmt(run['step_ms_median'])} | {_fmt(run['peak_memory_mb'], 0)} | "
                             f"{_fmt(run.get('compile_warmup_s'))} |")
            else:
                lines.append(f"| {label} | {run.get('batch_size', '-')} | failed: "
                             f"{str(run.get('error', '')).splitlines()[-1:] or ''} | | | |")
        t = resnet["targets"]
        lines += ["", f"O1 + compile vs O0 eager fp32: {_fmt(resnet.get('amp_compile_vs_eager_fp32'), 2)}x "
                      f"(target >= {t['speedup_vs_eager_fp32']}x: {'met' if t['speedup_met'] else 'NOT met'}); "
                      f"target >= {t['amp_compile_images_per_s']:,.0f} images/s: "
                      f"{'met' if t['images_per_s_met'] else 'NOT met'}"]
    for part, title in (("allreduce", "allreduce at 1 rank, CUDA float32: engine vs raw torch.distributed NCCL"),
                        ("host", "allreduce, 2 ranks sharing the GPU through host memory (engine)")):
        got = bench.get(part)
        if not got:
            continue
        lines += ["", f"## {title}", ""]
        if not got.get("ok"):
            lines.append(f"failed: {got.get('error', '')[-300:]}")
            continue
        lines += ["| bytes | accord us | accord algbw GB/s | raw us | raw algbw GB/s | overhead us/call |",
                  "|---|---|---|---|---|---|"]
        for r in got["rows"]:
            lines.append(f"| {r['size_bytes']} | {_fmt(r['accord_us'])} | {_fmt(r['accord_algbw_gbps'], 2)} | "
                         f"{_fmt(r['raw_us'])} | {_fmt(r['raw_algbw_gbps'], 2)} | {_fmt(r['overhead_us'])} |")
    if not bench:
        lines += ["", "benchmarks: no result (gpu_bench.json missing)"]
    return "\n".join(lines) + "\n"


def build(out: str, seconds: float | None) -> dict[str, Any]:
    """Everything the check produced, gathered from ``out``."""
    return {"kind": "gpu_check", "seconds": seconds, "environment": _load(os.path.join(out, "environment.json")),
            "tests": read_junit(os.path.join(out, "pytest_gpu.xml")),
            "bench": _load(os.path.join(out, "gpu_bench.json"))}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, default=None, help="the whole check's wall time")
    args = p.parse_args(argv)
    summary = build(args.out, args.seconds)
    record(summary, os.path.join(args.out, "gpu_check.json"), "gpu_summary.py", argv)
    text = markdown(summary)
    with open(os.path.join(args.out, "gpu_check.md"), "w") as fh:
        fh.write(text)
    print(text)
    tests = summary["tests"]
    ok = not tests.get("missing") and not tests["interrupted"] and tests["failed"] == 0 and tests["errors"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
