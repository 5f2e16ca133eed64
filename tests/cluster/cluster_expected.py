"""Expected values of tests/cluster/scripts/hvd_job.py, computed here independently."""
from __future__ import annotations

import hashlib

import torch

N, STEPS, LR = 1_500_001, 5, 0.1


def sum_digests(size: int) -> tuple[str, str]:
    """sha256 of the float32 and int64 allreduce results for ``size`` ranks."""
    factor = sum(r + 1 for r in range(size))
    f32 = (torch.arange(N) % 1000).double() * factor
    i64 = torch.arange(N // 10, dtype=torch.int64) * factor - 7 * size
    return (hashlib.sha256(f32.float().numpy().tobytes()).hexdigest(),
            hashlib.sha256(i64.numpy().tobytes()).hexdigest())


def trained_weights(size: int) -> list[float]:
    """The model after STEPS of SGD on the gradient averaged over every rank's data, starting
    from rank 0's initial weights (what data-parallel training must give on every rank)."""
    torch.manual_seed(1234)
    model = torch.nn.Linear(8, 1).double()
    data = []
    for r in range(size):
        gen = torch.Generator().manual_seed(100 + r)
        data.append((torch.randn(16, 8, generator=gen).double(), torch.randn(16, 1, generator=gen).double()))
    for _ in range(STEPS):
        grads = []
        for x, y in data:
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p -= LR * sum(g[i] for g in grads) / size
    return torch.cat([model.weight.view(-1), model.bias.view(-1)]).tolist()
