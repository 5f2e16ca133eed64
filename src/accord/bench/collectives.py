"""``accord-bench collectives``: the size sweep, run on every rank.

For each backend, accord is initialised with that backend (``engine.init()`` with
ACCORD_CPU_BACKEND / ACCORD_GPU_BACKEND set for the moment of init), then for every op, dtype
and size:

1. the result is checked once against values worked out here (rank r sends r + 1), so a fast
   but wrong path cannot produce a number;
2. warm-up iterations, then timed ones, each between barriers; with ``--compare raw`` the raw
   torch.distributed call runs in the same iteration, the order alternating, so machine noise
   hits both alike;
3. each iteration's time is the slowest rank's (an allreduce of MAX after the loop).

``api="engine"`` goes through the engine exactly as ``hvd.allreduce`` does (negotiation,
fusion, cycle time included); ``api="comm"`` calls the backend's communicator directly.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from accord import config, engine
from accord.bench import results
from accord.bench.environment import describe
from accord.bench.options import DTYPE_SIZES, CollectivesOptions
from accord.bench.report import progress_bar
from accord.bench.stats import format_size
from accord.bench.strategies import baseline_group
from accord.comm.backend import get_backend
from accord.comm.ops import ReduceOp
from accord.errors import CollectiveError, with_hint

_BACKEND_VARIABLE = {"cpu": "ACCORD_CPU_BACKEND", "cuda": "ACCORD_GPU_BACKEND"}

Run = Callable[[], torch.Tensor]
# Renamed in recent torch (the old names warn); keep working on torch >= 2.4.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@contextlib.contextmanager
def _selected_backend(device: str, backend: str) -> Iterator[None]:
    """Make ``backend`` the one accord's init picks for ``device``; restore afterwards."""
    variable = _BACKEND_VARIABLE[device]
    before = config.snapshot().get(variable)
    config.set_variables({variable: backend})
    try:
        yield
    finally:
        config.set_variables({variable: before})


def _barrier() -> None:
    # A tiny CPU allreduce on the default group: works for gloo and "cpu:gloo,cuda:nccl" alike.
    dist.all_reduce(torch.zeros(1))


def _engine_case(op: str, t: torch.Tensor, name: str) -> Run:
    sync, submit = engine.synchronize, engine.submit
    if op == "allreduce":
        return lambda: sync(submit("allreduce", t, name, in_place=True, reduce_op=ReduceOp.SUM))
    if op == "broadcast":
        return lambda: sync(submit("broadcast", t, name, in_place=True, root_rank=0))
    if op == "allgather":
        return lambda: sync(submit("allgather", t, name))
    if op == "reducescatter":
        return lambda: sync(submit("reducescatter", t, name, reduce_op=ReduceOp.SUM))
    return lambda: sync(submit("alltoall", t, name))[0]


def _comm_case(op: str, t: torch.Tensor, comm: Any) -> Run:
    if op == "allreduce":
        return lambda: (comm.allreduce(t, ReduceOp.SUM), t)[1]
    if op == "broadcast":
        return lambda: (comm.broadcast(t, 0), t)[1]
    if op == "allgather":
        return lambda: comm.allgather(t)
    if op == "reducescatter":
        return lambda: comm.reduce_scatter(t, ReduceOp.SUM)
    return lambda: comm.alltoall(t, None)[0]


def _raw_case(op: str, t: torch.Tensor, n: int) -> Run:
    if op == "allreduce":
        return lambda: (dist.all_reduce(t), t)[1]
    if op == "broadcast":
        return lambda: (dist.broadcast(t, src=0), t)[1]
    if op == "allgather":
        out = t.new_empty(t.numel() * n)
        return lambda: (_all_gather_single(out, t), out)[1]
    if op == "reducescatter":
        out = t.new_empty(t.numel() // n)
        return lambda: (_reduce_scatter_single(out, t), out)[1]
    out = torch.empty_like(t)
    return lambda: (dist.all_to_all_single(out, t), out)[1]


def _expected(op: str, n: int, out_numel: int) -> torch.Tensor:
    """What rank r's output must hold when every rank sent r + 1 (root 0 for broadcast)."""
    if op in ("allreduce", "reducescatter"):
        return torch.full((out_numel,), n * (n + 1) / 2, dtype=torch.float64)
    if op == "broadcast":
        return torch.ones(out_numel, dtype=torch.float64)
    per = out_numel // n
    return torch.arange(1, n + 1, dtype=torch.float64).repeat_interleave(per)


def _verify(what: str, op: str, run: Run, t: torch.Tensor, rank: int, n: int) -> None:
    t.fill_(rank + 1)
    out = run().reshape(-1)
    expected = _expected(op, n, out.numel())
    got = out.to(device="cpu", dtype=torch.float64)
    if not torch.equal(got, expected):
        bad = int((got != expected).nonzero()[0, 0]) if got.shape == expected.shape else -1
        raise CollectiveError(with_hint(
            f"benchmark check failed on rank {rank}: {what} returned {got.numel()} elements "
            f"(expected {expected.numel()}); first difference at index {bad}: "
            f"got {got[bad].item() if bad >= 0 else '-'}, expected {expected[bad].item() if bad >= 0 else '-'}",
            "the collective is wrong on this backend: run the comm test suite for it "
            "(tests/multiprocess) before trusting any timing"))
    t.zero_()  # timed iterations reduce zeros: no overflow, no denormals


def _timed(cases: dict[str, Run], iters: int, warmup: int, device: str) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    cuda = device == "cuda"
    for it in range(warmup + iters):
        for name in (names if it % 2 == 0 else names[::-1]):
            _barrier()
            start = time.perf_counter()
            cases[name]()
            if cuda:
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            if it >= warmup:
                samples[name].append(elapsed)
    for name in names:  # an iteration lasts as long as its slowest rank
        t = torch.tensor(samples[name], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        samples[name] = t.tolist()
    return samples


def _measure(opts: CollectivesOptions, backend: str, comm: Any, op: str, dtype: str,
             size: int, rank: int, n: int, device: torch.device) -> dict[str, Any]:
    count, nbytes = results.message_shape(op, size, DTYPE_SIZES[dtype], n)
    torch_dtype = getattr(torch, dtype)
    t = torch.zeros(count, dtype=torch_dtype, device=device)
    name = f"bench.{op}.{dtype}.{nbytes}"
    accord_run = _engine_case(op, t, name) if comm is None else _comm_case(op, t, comm)
    cases = {"accord": accord_run}
    raw_t = None
    if opts.compare_raw:
        raw_t = torch.zeros_like(t)
        cases["raw"] = _raw_case(op, raw_t, n)
    if opts.check:
        _verify(f"{op} {dtype} {nbytes}B on {backend} ({opts.api})", op, accord_run, t, rank, n)
        if raw_t is not None:
            _verify(f"raw torch.distributed {op} {dtype} {nbytes}B", op, cases["raw"], raw_t, rank, n)
    samples = _timed(cases, opts.iters, opts.warmup, device.type)
    return results.bandwidth_row(op, nbytes, count, n, samples["accord"], samples.get("raw"),
                                 verified=True if opts.check else None)


def _progress_line(series: dict[str, Any], row: dict[str, Any]) -> str:
    raw = ("" if row["ratio"] is None
           else f"  raw busbw {row['raw']['busbw_gbps']['median']:.3f}  ratio {row['ratio']:.2f}")
    return (f"[{series['backend']}/{series['api']}] {series['op']} {series['dtype']} "
            f"{format_size(row['size_bytes'])}: {row['time_us']['median']:.1f} us  "
            f"busbw {row['busbw_gbps']['median']:.3f} GB/s{raw}")


def _sweep(opts: CollectivesOptions, backend: str, say: Callable[[str, bool], None]) -> list[dict[str, Any]]:
    """Every op x dtype x size on one backend (accord initialised with it by the caller)."""
    topo = engine.topology()
    rank, n = topo.rank, topo.size
    if opts.device == "cuda":
        torch.cuda.set_device(topo.local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    comm = engine.build_communicator(get_backend(backend), range(n)) if opts.api == "comm" else None
    out = []
    try:
        for op in opts.ops:
            for dtype in opts.dtypes:
                series = {"backend": backend, "api": opts.api, "op": op, "dtype": dtype,
                          "device": opts.device, "world_size": n, "rows": []}
                for size in opts.sizes:
                    row = _measure(opts, backend, comm, op, dtype, size, rank, n, device)
                    series["rows"].append(row)
                    say(_progress_line(series, row), True)
                out.append(series)
    finally:
        if comm is not None and hasattr(comm, "close"):
            comm.close()
    return out


def run(opts: CollectivesOptions, verbose: bool = True) -> dict[str, Any] | None:
    """Measure every backend x op x dtype x size on this rank; rank 0 returns the results.

    Collective over every rank of the job (all ranks call it with the same options).
    """
    torch.set_num_threads(opts.threads)
    all_series: list[dict[str, Any]] = []
    environment: dict[str, Any] | None = None
    rank = 0
    bar = None

    def say(line: str, advance: bool) -> None:
        if rank != 0 or not verbose:
            return
        (bar.write if bar is not None else print)(line)
        sys.stdout.flush()
        if bar is not None and advance:
            bar.update(1)

    for backend in opts.backends:
        with _selected_backend(opts.device, backend):
            engine.init()
        try:
            rank, n = engine.topology().rank, engine.topology().size
            if bar is None and rank == 0 and verbose:
                total = len(opts.backends) * len(opts.ops) * len(opts.dtypes) * len(opts.sizes)
                bar = progress_bar(total, "collectives", opts.progress)
            with baseline_group():
                all_series += _sweep(opts, backend, say)
            if environment is None:
                environment = describe(world_size=n, threads=opts.threads,
                                       backend=",".join(opts.backends), device=opts.device)
        finally:
            engine.shutdown()
    if bar is not None:
        bar.close()
    if rank != 0:
        return None
    return {"kind": "collectives", "environment": environment, "config": dataclasses.asdict(opts),
            "series": all_series}
