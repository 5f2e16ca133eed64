"""The weights tests/integration/scripts/agent_elastic_train.py should end with, computed in one
process (no accord): step ``s`` on ``sizes[s]`` workers averages the gradients of ranks
``0..sizes[s]-1``, rank ``r`` training on data seeded ``100*s + r``."""
from __future__ import annotations


def expected_linear_params(sizes: list[int], lr: float = 0.1) -> list[float]:
    """The script's ``weight + bias`` after one SGD step per entry of ``sizes``."""
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1).double()
    for step, size in enumerate(sizes):
        grads = []
        for rank in range(size):
            model.zero_grad()
            gen = torch.Generator().manual_seed(100 * step + rank)
            x = torch.randn(4, 3, generator=gen, dtype=torch.float64)
            y = torch.randn(4, 1, generator=gen, dtype=torch.float64)
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p -= lr * sum(g[i] for g in grads) / size
    return model.weight.flatten().tolist() + model.bias.flatten().tolist()


def done_lines(stdout: str) -> list[dict]:
    """The script's ``DONE {...}`` records in an agent's output."""
    import json

    return [json.loads(line.split("DONE ", 1)[1]) for line in stdout.splitlines() if "DONE {" in line]
