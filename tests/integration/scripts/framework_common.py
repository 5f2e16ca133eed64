"""What the framework integration scripts and their tests share, in plain torch (no Lightning, no accord):
the data, the model, where each rank's batches come from, and the reference training that the
tests compute the expected weights with, on one process.

A job's ranks build their models from different seeds (as scripts that set none do), so equal
final weights on every rank also show that rank 0's initial weights reached the others; the
reference starts from rank 0's. Everything is float64, so the reference and a 2-rank run differ
only by the order of a few additions.
"""
from __future__ import annotations

import json
import os
from typing import Callable, Sequence

import torch
from torch.utils.data import DistributedSampler

SAMPLES, FEATURES, BATCH = 40, 4, 4  # 40 samples: 20 per rank on 2 ranks, 5 batches of 4 each
WORLD = 2


def data() -> tuple[torch.Tensor, torch.Tensor]:
    """The dataset: 40 samples of 4 features and a noisy linear target."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(SAMPLES, FEATURES, generator=gen, dtype=torch.float64)
    y = x @ torch.tensor([[0.5], [-1.0], [2.0], [0.25]], dtype=torch.float64) \
        + 0.1 * torch.randn(SAMPLES, 1, generator=gen, dtype=torch.float64)
    return x, y


def network(seed: int) -> torch.nn.Module:
    """The model, initialized from ``seed``."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()


def init_seed(rank: int) -> int:
    """The seed rank ``rank`` builds its model from (each rank its own)."""
    return 1000 + rank


def shard(rank: int, epoch: int = 0, shuffle: bool = True, world: int = WORLD) -> list[int]:
    """The sample indices torch's DistributedSampler gives ``rank`` in ``epoch``: shuffled (seed 0,
    reshuffled each epoch) as the Trainer's for training data, in order as Fabric's for a loader
    that does not shuffle."""
    sampler = DistributedSampler(range(SAMPLES), num_replicas=world, rank=rank, shuffle=shuffle, seed=0)
    sampler.set_epoch(epoch)
    return list(sampler)


def batches(rank: int, epoch: int = 0, shuffle: bool = True, world: int = WORLD) -> list[list[int]]:
    """``rank``'s batches in ``epoch``, in order."""
    mine = shard(rank, epoch, shuffle, world)
    return [mine[i:i + BATCH] for i in range(0, len(mine), BATCH)]


def plan(epochs: int, accumulate: int = 1, limit: int | None = None,
         shuffle: bool = True) -> list[list[list[list[int] | None]]]:
    """The optimizer steps of a fit on 2 ranks with the DistributedSampler: each step a list of
    micro-batches, each micro-batch every rank's indices (None for a rank that has no batch)."""
    steps = []
    for epoch in range(epochs):
        per_rank = [batches(r, epoch, shuffle)[:limit] for r in range(WORLD)]
        count = len(per_rank[0])
        for start in range(0, count, accumulate):
            steps.append([[per_rank[r][i] for r in range(WORLD)] for i in range(start, min(start + accumulate, count))])
    return steps


def reference(plan_: Sequence[Sequence[Sequence[list[int] | None]]], make_optimizer: Callable, *,
              accumulate: int = 1, clip: tuple[str, float] | None = None,
              schedule: Callable | None = None) -> dict[str, list[float]]:
    """Train one process the way the ranks train together and return its final weights: each
    step's gradient is the ranks' gradients (of their batch's mean loss / ``accumulate``, summed
    over the step's micro-batches) averaged over the world, a missing rank adding zeros; then
    ``clip`` (("norm", max) or ("value", max)), then the optimizer's step (and ``schedule``'s)."""
    x, y = data()
    model = network(init_seed(0))
    optimizer = make_optimizer(model.parameters())
    scheduler = schedule(optimizer) if schedule else None
    for step in plan_:
        optimizer.zero_grad()
        for micro in step:
            for indices in micro:
                if indices is None:
                    continue
                loss = torch.nn.functional.mse_loss(model(x[indices]), y[indices]) / accumulate / WORLD
                loss.backward()
        if clip is not None and clip[0] == "norm":
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip[1])
        elif clip is not None:
            torch.nn.utils.clip_grad_value_(model.parameters(), clip[1])
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return weights(model)


def weights(model: torch.nn.Module) -> dict[str, list[float]]:
    """The model's parameters by name, as lists (JSON-ready)."""
    return {name: p.detach().double().flatten().tolist() for name, p in model.named_parameters()}


def write(out: str, case: str, rank: int, result: dict) -> None:
    """Save one rank's result of one case."""
    with open(os.path.join(out, f"{case}.{rank}.json"), "w") as fh:
        json.dump(result, fh)


def read(out: str, case: str, world: int = WORLD) -> list[dict]:
    """Every rank's result of ``case`` (a missing file fails the test that asks)."""
    found = []
    for rank in range(world):
        with open(os.path.join(out, f"{case}.{rank}.json")) as fh:
            found.append(json.load(fh))
    return found
