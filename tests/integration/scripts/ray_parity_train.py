"""One small training, the same under accordrun and accord.ray.RayExecutor (tests/integration/test_ray.py).

A linear model in float64, seeded, trained for a few SGD steps with hvd.DistributedOptimizer on
each rank's half of a seeded data set. Under accordrun (``accordrun -np 2 python
ray_parity_train.py OUT``) every rank writes its result to ``OUT.<rank>`` as JSON; RayExecutor
calls :func:`train` and gets the same dictionaries back. :func:`reference` is the same training
on one process over the whole data set: averaging the two halves' mean-loss gradients is the
whole batch's mean-loss gradient, so every rank must end with its parameters.
"""
import json
import sys

import torch

SAMPLES, FEATURES, STEPS, LR = 16, 4, 6, 0.05


def data():
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=g, dtype=torch.float64)
    w = torch.tensor([[1.0], [-2.0], [0.5], [3.0]], dtype=torch.float64)
    return x, x @ w + 0.1


def fresh_model():
    torch.manual_seed(7)
    return torch.nn.Linear(FEATURES, 1).double()


def _steps(model, optimizer, x, y):
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]


def train():
    import accord.torch as hvd

    hvd.init()
    try:
        model = fresh_model()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                             named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        x, y = data()
        per_rank = SAMPLES // hvd.size()
        mine = slice(hvd.rank() * per_rank, (hvd.rank() + 1) * per_rank)
        params = _steps(model, optimizer, x[mine], y[mine])
        return {"rank": hvd.rank(), "size": hvd.size(), "params": params}
    finally:
        hvd.shutdown()


def reference():
    model = fresh_model()
    x, y = data()
    return _steps(model, torch.optim.SGD(model.parameters(), lr=LR), x, y)


if __name__ == "__main__":
    result = train()
    with open(f"{sys.argv[1]}.{result['rank']}", "w", encoding="utf-8") as fh:
        json.dump(result, fh)
