"""Planned cycles on CUDA tensors (see accord/engine/cycle/plan.py), run on every rank of a job.

A step that repeats (the same names, synchronously or as a fused batch) stops negotiating after a
few cycles and runs as a plan, on the caller's own thread when it waits (caller_runs.py). On
CUDA tensors the plan must keep the stream rules: the input is written on a side stream after a
GPU sleep, the collective is submitted under that stream, and the result is read on the default
stream right after the call, with no other wait. Leaving the plan (another name) and coming
back must not lose or mix up values. Expected values are computed here from the step number.
With ``ACCORD_GPU_TESTS_ON_CPU=1`` the same steps run on CPU tensors without streams.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from helpers.gpu_checks import DEVICE, Collector, finish, start

STEPS = 12  # a plan starts after 3 identical cycles; the rest of the steps run planned
GPU_SLEEP = 20_000_000  # ~10 ms of GPU time: far longer than a cycle takes to start


def _writer(dev: torch.device) -> tuple[Any, Any]:
    """(a context that makes writes land late on a side stream, the stream or None)."""
    if dev.type != "cuda":
        return contextlib.nullcontext, None
    side = torch.cuda.Stream(dev)

    @contextlib.contextmanager
    def late() -> Any:
        with torch.cuda.stream(side):
            torch.cuda._sleep(GPU_SLEEP)
            yield
    return late, side


def _stats() -> dict[str, int]:
    from accord.engine import session

    return session.engine().stats()


def planned_cycles(c: Collector, size: int) -> None:
    """Lone synchronous allreduces, fused async batches, and leaving/re-entering the plan,
    with every step's values checked and the plan seen in the engine's counters."""
    import accord.torch as hvd

    dev = torch.device("cuda", torch.cuda.current_device()) if DEVICE == "cuda" else torch.device("cpu")
    late, side = _writer(dev)
    before = _stats()
    x = torch.zeros(1 << 12, device=dev)
    a, b = torch.zeros(1000, device=dev), torch.zeros(3000, device=dev)

    def lone(step: int, name: str = "plan.lone") -> None:
        with late():
            x.fill_(step + 1)
            out = hvd.allreduce(x, op=hvd.Sum, name=name)
        c.same(f"{name} step {step}", out, torch.full((1 << 12,), float((step + 1) * size)), DEVICE)

    def fused(step: int) -> None:
        with late():
            a.fill_(step + 1)
            b.fill_(-(step + 1))
            handles = [hvd.allreduce_async_(a, op=hvd.Sum, name="plan.a"),
                       hvd.allreduce_async_(b, op=hvd.Average, name="plan.b")]
            outs = [hvd.synchronize(h) for h in handles]
        c.same(f"fused plan.a step {step}", outs[0], torch.full((1000,), float((step + 1) * size)), DEVICE)
        c.same(f"fused plan.b step {step}", outs[1], torch.full((3000,), -float(step + 1)), DEVICE)

    def run() -> None:
        for step in range(STEPS):
            lone(step)
        middle = _stats()
        lone(STEPS, name="plan.other")  # leaves the plan on every rank
        for step in range(STEPS):
            lone(step)
        for step in range(STEPS):
            fused(step)
        if side is not None:
            side.synchronize()
        after = _stats()
        planned = after["planned_cycles"] - before["planned_cycles"]
        # each run of STEPS has at least STEPS - 4 planned cycles; on the CPU the shm backend
        # reduces fused batches without a buffer, which a plan would give up (plan.py)
        runs = 3 if DEVICE == "cuda" else 2
        c.true("steps ran planned", planned >= runs * (STEPS - 4), f"planned cycles {planned}")
        c.true("the plan was left for another name", after["negotiations"] > middle["negotiations"],
               f"negotiations {middle['negotiations']} -> {after['negotiations']}")
        c.true("a waiting caller ran planned cycles", after["lent_cycles"] > before["lent_cycles"],
               f"lent cycles {before['lent_cycles']} -> {after['lent_cycles']}")
    c.guarded("planned cycles", run)


def planned_rank(rank: int, size: int, cuda_backend: str, cpu_backend: str | None = None) -> tuple[int, list[str]]:
    """A rank of a tests/gpu job: start, :func:`planned_cycles`, finish (for ``run_ranks``)."""
    c = start(rank, cuda_backend, cpu_backend)
    planned_cycles(c, size)
    return finish(c)
