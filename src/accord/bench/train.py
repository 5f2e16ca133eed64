"""``accord-bench train``: training throughput, run on every rank of one job.

One invocation measures, in this order and in the same processes:

1. ``single``: rank 0 alone trains with no communication (the other ranks sleep on a store
   key, so they take no CPU): the 1-process reference for scaling efficiency;
2. ``accord``: every rank, ``hvd.DistributedOptimizer``;
3. the baseline (``ddp`` or ``horovod-style``), every rank, unless ``--baseline none``;

``--repeats R`` runs the sequence R times, accord and the baseline swapping places each time.
With one rank only (1) runs. Each run: ``warmup`` steps (the first one compiles under
``--compiler-opt`` and is reported on its own), then ``steps`` timed steps; a step is
zero_grad, forward, backward, gradient reduction, optimizer step (CUDA synchronized before
the clock stops). Rank 0 prints a line every ``log_interval`` steps and returns the results.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from accord import engine
from accord.bench import results
from accord.bench.environment import describe
from accord.bench.memory import MemoryMeter
from accord.bench.options import TrainOptions
from accord.bench.precision import Precision
from accord.bench.report import progress_bar
from accord.bench.strategies import baseline_group, make_strategy
from accord.bench.workload import batches, build_model, image_size

_SINGLE_DONE = "accord-bench/single-done"


def _device(opts: TrainOptions, local_rank: int) -> torch.device:
    kind = opts.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        torch.backends.cudnn.benchmark = True  # the input shape never changes: pick the fastest kernels once
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _interval_line(label: str, step: int, total: int, warm: bool, loss: float, seconds: list[float],
                   world: int, batch: int, memory: str) -> str:
    mean = sum(seconds) / len(seconds)
    per_device = batch / mean
    phase = " (warm-up)" if warm else ""
    return (f"[{label}] step {step:>4}/{total}{phase}  loss {loss:.4f}  step {mean * 1e3:.1f} ms  "
            f"{per_device:.2f} samples/s/device  {per_device * world:.2f} samples/s total  {memory}")


def _run(label: str, kind: str, opts: TrainOptions, rank: int, size: int, device: torch.device,
         report: bool, barrier: Callable[[], None], group: Any = None) -> dict[str, Any]:
    """Train ``warmup + steps`` steps with strategy ``kind`` on ``size`` ranks; time each step
    (``group``: the accord-backend process group of ``accord-ddp``)."""
    torch.manual_seed(opts.seed)  # the same initial weights everywhere (and broadcast anyway)
    layout = torch.channels_last if opts.channels_last else torch.contiguous_format
    model = build_model(opts).to(device, memory_format=layout)
    data = batches(opts, rank, size, device)
    precision = Precision(opts.amp_level, opts.amp_dtype, device.type)
    strategy = make_strategy(kind, model, precision, lr=opts.lr, size=size, device=device,
                             compression=opts.compression if kind == "accord" else "none",
                             group=group)
    net = torch.compile(strategy.model) if opts.compiler_opt else strategy.model
    total = opts.warmup + opts.steps
    meter = MemoryMeter(device)
    bar = progress_bar(total, label, report and opts.progress)
    emit = (bar.write if bar is not None else lambda s: print(s, flush=True)) if report else None
    times: list[float] = []
    window: list[float] = []
    losses: list[tuple[int, float]] = []
    barrier()
    for step in range(1, total + 1):
        x, y = next(data)
        x = x.contiguous(memory_format=layout)  # a no-op unless --channels-last
        start = time.perf_counter()
        strategy.model.zero_grad(set_to_none=True)
        with precision.autocast():
            loss = F.cross_entropy(net(precision.inputs(x)).float(), y)
        precision.backward(loss)
        strategy.reduce()
        with strategy.stepping():
            precision.step(strategy.optimizer)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        window.append(times[-1])
        meter.sample()
        if bar is not None:
            bar.update(1)
        if step % opts.log_interval == 0 or step == total or step == opts.warmup:
            losses.append((step, float(loss.item())))
            if emit is not None:
                emit(_interval_line(label, step, total, step <= opts.warmup, losses[-1][1], window,
                                    size, opts.batch_size, meter.describe()))
            window = []
    if bar is not None:
        bar.close()
    peak = meter.peak_mb()
    if size > 1:  # the job's peak: the largest rank's
        t = torch.tensor([peak], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        peak = float(t.item())
    strategy.close()
    return {"times": times[opts.warmup:], "first_step_s": times[0], "warmup_s": sum(times[:opts.warmup]),
            "peak_memory_mb": peak, "memory_kind": meter.kind, "losses": losses,
            "compute_dtype": precision.compute_dtype}


def _merge(label: str, kind: str, size: int, opts: TrainOptions, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from the repeats of one run: their timed steps pooled, the first one's losses."""
    first = parts[0]
    return results.train_run(
        label, size, opts.batch_size, [t for p in parts for t in p["times"]], strategy=kind,
        repeats=len(parts), first_step_s=first["first_step_s"], warmup_s=first["warmup_s"],
        compile_warmup_s=first["warmup_s"] if opts.compiler_opt else None,
        peak_memory_mb=max(p["peak_memory_mb"] for p in parts), memory_kind=first["memory_kind"],
        losses=first["losses"], compute_dtype=first["compute_dtype"],
        compression=opts.compression if kind == "accord" else "none",
    )


def _wait_for_single(rank: int, repeat: int) -> None:
    """Ranks other than 0 sleep until rank 0's 1-process run is done (no collective timeout)."""
    store = engine.runtime().store
    key = f"{_SINGLE_DONE}/{repeat}"
    if rank == 0:
        store.set(key, "1")
        return
    while not store.check([key]):
        time.sleep(0.2)


def run(opts: TrainOptions) -> dict[str, Any] | None:
    """Measure the 1-process, accord and baseline runs; rank 0 returns the results.

    With ``repeats`` > 1 the sequence runs that many times, accord and the baseline swapping
    places every time (ABBA), and each run's timed steps are pooled. Collective over every
    rank of the job (all call it with the same options).
    """
    import accord.torch as hvd

    torch.set_num_threads(opts.threads)
    hvd.init()
    try:
        with baseline_group():
            return _run_all(opts)
    finally:
        hvd.shutdown()


def _run_all(opts: TrainOptions) -> dict[str, Any] | None:
    import accord.torch as hvd

    rank, size = hvd.rank(), hvd.size()
    device = _device(opts, hvd.local_rank())

    def barrier() -> None:
        if size > 1:
            dist.all_reduce(torch.zeros(1))  # CPU tensor: the default group's Gloo part

    plan = [("accord", "accord-ddp" if opts.accord_api == "ddp" else "accord")]
    # DDP on accord's torch.distributed backend: a group of its own beside the default Gloo one
    # the baselines use (collective: every rank creates it, once)
    group = dist.new_group(backend="accord") if opts.accord_api == "ddp" and size > 1 else None
    if opts.baseline != "none":
        plan.append((opts.baseline, opts.baseline))
    parts: dict[str, list[dict[str, Any]]] = {"single": [], **{label: [] for label, _ in plan}}
    for repeat in range(opts.repeats):
        tag = f" #{repeat + 1}" if opts.repeats > 1 else ""
        if rank == 0:
            parts["single"].append(_run("single" + tag, "local", opts, 0, 1, device, True, lambda: None))
        if size > 1:
            _wait_for_single(rank, repeat)
            for label, kind in (plan if repeat % 2 == 0 else plan[::-1]):
                parts[label].append(_run(label + tag, kind, opts, rank, size, device, rank == 0, barrier,
                                         group))
    backend = engine.backend_name(device.type)
    environment = describe(world_size=size, threads=opts.threads, backend=backend, device=device.type)
    if rank != 0:
        return None
    kinds = {"single": "local", **dict(plan)}
    runs = [_merge(label, kinds[label], 1 if label == "single" else size, opts, got)
            for label, got in parts.items() if got]
    results.compare_runs(runs, "single", None if opts.baseline == "none" else opts.baseline)
    config_out = dataclasses.asdict(opts)
    config_out["image_size"] = image_size(opts)
    return {"kind": "train", "environment": environment, "config": config_out, "runs": runs}
