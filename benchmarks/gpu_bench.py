"""The GPU benchmarks of scripts/gpu_check.sh, on one GPU, each part under a time budget.

    python benchmarks/gpu_bench.py [--device cuda|cpu] [--quick] [--out DIR] [--parts resnet,allreduce,host]

1. ``resnet``: ``accord-bench train --model resnet50 --image-size 224`` on synthetic data, one
   rank, at the largest batch that fits (probed first, from 1024 down), for O0 (eager fp32),
   O1 (AMP: fp16 autocast + GradScaler, the CUDA default) and O1 + ``--compiler-opt``
   (torch.compile), all NHWC (``--channels-last``): samples/s and peak GPU memory. Targets:
   O1 + compile >= 3,000 images/s on an H100, and >= 1.5x O0 in the same run.
2. ``allreduce``: ``accord-bench collectives --compare raw`` at one rank on CUDA tensors: the
   engine's time per call against raw ``torch.distributed`` NCCL, interleaved. At one rank bus
   bandwidth is 0 by definition (NCCL-tests' factor 2(n-1)/n), so the per-call overhead and
   algorithm bandwidth are what it shows.
3. ``host``: two ranks sharing the one GPU through host memory (the ``host`` backend NCCL
   cannot replace there): engine allreduce time and bandwidth, for the record.

Each part runs ``python -m accord.bench`` in a child process with a timeout and writes that
command's JSON under ``--out`` (default benchmarks/results/gpu); this script then writes
``gpu_bench.json`` (every figure, the targets and whether they were met) there.
``--device cpu --quick`` runs the same code paths with tiny sizes (lenet, small collectives),
to check the script on a machine without a GPU; its figures mean nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from recording import record

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "results", "gpu")
BATCHES = (1024, 768, 512, 384, 256, 192, 128, 64, 32, 16, 8, 4)
TARGET_IMAGES_S = 3000.0
TARGET_SPEEDUP = 1.5
CONFIGS = (("O0", False), ("O1", False), ("O1", True))


def _bench(args: list[str], timeout: float) -> tuple[bool, str]:
    """Run ``python -m accord.bench ARGS``; (succeeded, last lines of its output)."""
    cmd = [sys.executable, "-m", "accord.bench", *args]
    print("+", " ".join(cmd), flush=True)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return False, f"timed out after {timeout:.0f}s: {partial[-1500:]}"
    tail = (done.stdout + done.stderr)[-3000:]
    print(tail, flush=True)
    return done.returncode == 0, tail


def probe_batch(level: str, model: str, image: int, device: str, largest: int) -> int:
    """The largest batch of BATCHES (<= ``largest``) for which two training steps of ``model``
    at AMP ``level`` fit in the device's memory (NHWC, eager); 0 if none does."""
    import torch

    from accord.bench.options import TrainOptions
    from accord.bench.precision import Precision
    from accord.bench.workload import batches, build_model

    dev = torch.device(device)
    for batch in (b for b in BATCHES if b <= largest):
        opts = TrainOptions(model=model, batch_size=batch, amp_level=level, amp_dtype="auto",
                            compiler_opt=False, channels_last=True, steps=1, warmup=0, repeats=1,
                            log_interval=1, data="synthetic", image_size=image, baseline="none",
                            compression="none", device=device, threads=1, lr=0.01, seed=0, progress=False)
        net = opt = x = y = loss = None
        try:
            net = build_model(opts).to(dev, memory_format=torch.channels_last)
            precision = Precision(level, "auto", dev.type)
            opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
            x, y = next(batches(opts, 0, 1, dev))
            x = x.contiguous(memory_format=torch.channels_last)
            for _ in range(2):
                opt.zero_grad(set_to_none=True)
                with precision.autocast():
                    loss = torch.nn.functional.cross_entropy(net(x).float(), y)
                precision.backward(loss)
                precision.step(opt)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            return batch
        except RuntimeError as exc:  # torch.cuda.OutOfMemoryError, or cuDNN failing to allocate
            if "out of memory" not in str(exc).lower() and "alloc" not in str(exc).lower():
                raise
        finally:
            del net, opt, x, y, loss
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return 0


def _probe(level: str, model: str, image: int, device: str, largest: int, timeout: float) -> int:
    """:func:`probe_batch` in a child process (a clean GPU for the measured runs after it)."""
    cmd = [sys.executable, os.path.abspath(__file__), "probe", level, model, str(image), device, str(largest)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return int(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        return 0


def resnet(out: str, device: str, quick: bool, budget: float) -> dict[str, Any]:
    """Part 1: O0 / O1 / O1 + compile at the largest batch that fits."""
    model, image = ("lenet", 28) if quick else ("resnet50", 224)
    steps, warmup = (2, 1) if quick else (20, 3)
    runs: dict[str, Any] = {}
    deadline = time.monotonic() + budget
    for level, compiled in CONFIGS:
        label = f"{level}{'_compiled' if compiled else ''}"
        left = deadline - time.monotonic()
        if left < 30:
            runs[label] = {"ok": False, "error": "skipped: the part's time budget was spent"}
            continue
        largest = 8 if quick else BATCHES[0]
        batch = _probe(level, model, image, device, largest, min(120.0, left / 2)) if not compiled \
            else runs.get("O1", {}).get("batch_size", 0)
        if not batch:
            runs[label] = {"ok": False, "error": "no batch size fits (or the probe failed)"}
            continue
        path = os.path.join(out, f"train_{model}_{label}.json")
        args = ["train", "--model", model, "--image-size", str(image), "--nproc-per-node", "1",
                "--baseline", "none", "--amp-level", level, "--batch-size", str(batch),
                "--steps", str(steps), "--warmup", str(warmup), "--device", device,
                "--channels-last", "--no-progress", "--json", path] + (["--compiler-opt"] if compiled else [])
        ok, tail = _bench(args, deadline - time.monotonic())
        if not ok and "out of memory" in tail.lower() and batch > BATCHES[-1]:
            # at the edge of memory, cudnn.benchmark's workspaces or compiled graphs can need more
            batch = max(b for b in BATCHES if b < batch)
            args[args.index("--batch-size") + 1] = str(batch)
            ok, tail = _bench(args, deadline - time.monotonic())
        if not ok:
            runs[label] = {"ok": False, "batch_size": batch, "error": tail[-800:]}
            continue
        with open(path) as fh:
            single = json.load(fh)["runs"][0]
        runs[label] = {"ok": True, "batch_size": batch, "images_per_s": single["throughput"],
                       "step_ms_median": single["step_ms"]["median"],
                       "peak_memory_mb": single["peak_memory_mb"], "memory_kind": single["memory_kind"],
                       "compile_warmup_s": single.get("compile_warmup_s"), "json": os.path.basename(path)}
    eager, best = runs.get("O0", {}), runs.get("O1_compiled", {})
    speedup = (best["images_per_s"] / eager["images_per_s"]
               if best.get("ok") and eager.get("ok") else None)
    return {"model": model, "image_size": image, "steps": steps, "warmup": warmup, "runs": runs,
            "amp_compile_vs_eager_fp32": speedup,
            "targets": {"amp_compile_images_per_s": TARGET_IMAGES_S, "speedup_vs_eager_fp32": TARGET_SPEEDUP,
                        "images_per_s_met": bool(best.get("ok") and best["images_per_s"] >= TARGET_IMAGES_S),
                        "speedup_met": bool(speedup is not None and speedup >= TARGET_SPEEDUP)}}


def _rows(path: str) -> list[dict[str, Any]]:
    with open(path) as fh:
        series = json.load(fh)["series"]
    rows = []
    for s in series:
        for r in s["rows"]:
            raw = r.get("raw")
            rows.append({"backend": s["backend"], "dtype": s["dtype"], "world_size": s["world_size"],
                         "size_bytes": r["size_bytes"], "accord_us": r["time_us"]["median"],
                         "accord_algbw_gbps": r["algbw_gbps"]["median"],
                         "busbw_gbps": r["busbw_gbps"]["median"],
                         "raw_us": raw["time_us"]["median"] if raw else None,
                         "raw_algbw_gbps": raw["algbw_gbps"]["median"] if raw else None,
                         "overhead_us": r["time_us"]["median"] - raw["time_us"]["median"] if raw else None,
                         "ratio": r["ratio"]})
    return rows


def collectives(out: str, device: str, quick: bool, budget: float, host: bool) -> dict[str, Any]:
    """Part 2 (engine vs raw NCCL at one rank) or part 3 (two ranks through host memory)."""
    sizes = "4,1K,64K" if quick else "4,4K,256K,1M,16M,64M,256M"
    iters = "5" if quick else "50"
    name = "allreduce_host_2ranks" if host else "allreduce_1rank"
    path = os.path.join(out, f"{name}.json")
    args = ["collectives", "--ops", "allreduce", "--sizes", sizes, "--dtype", "float32",
            "--device", device, "--api", "engine", "--iters", iters, "--warmup", "5",
            "--no-progress", "--json", path]
    if host:
        args += ["--nproc-per-node", "2", "--backends", "host" if device == "cuda" else "shm"]
    else:
        args += ["--nproc-per-node", "1", "--compare", "raw", "--backends", "nccl" if device == "cuda" else "gloo"]
    ok, tail = _bench(args, budget)
    if not ok:
        return {"ok": False, "error": tail[-800:]}
    return {"ok": True, "rows": _rows(path), "json": os.path.basename(path)}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "probe":  # internal: python gpu_bench.py probe LEVEL MODEL IMAGE DEVICE LARGEST
        level, model, image, device, largest = argv[1:6]
        print(probe_batch(level, model, int(image), device, int(largest)))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks the code paths only")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--parts", default="resnet,allreduce,host")
    p.add_argument("--budget-s", type=float, default=285.0, help="seconds for all parts together")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    shares = {"resnet": 0.80, "allreduce": 0.12, "host": 0.08}
    result: dict[str, Any] = {"kind": "gpu_bench", "device": args.device, "quick": args.quick}
    for part in parts:
        budget = args.budget_s * shares.get(part, 0.2)
        start = time.monotonic()
        if part == "resnet":
            result["resnet"] = resnet(args.out, args.device, args.quick, budget)
        elif part in ("allreduce", "host"):
            result[part] = collectives(args.out, args.device, args.quick, budget, host=part == "host")
        else:
            p.error(f"unknown part {part!r}; known: resnet, allreduce, host")
        result.setdefault("seconds", {})[part] = round(time.monotonic() - start, 1)
    record(result, os.path.join(args.out, "gpu_bench.json"), "gpu_bench.py", argv)
    print(json.dumps({k: v for k, v in result.items() if k != "command"}, indent=1)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
