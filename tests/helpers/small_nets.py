"""A tiny deterministic network and dataset shared by the Model.fit tests."""
import numpy as np
import torch
from torch import nn


def _net(seed):
    """A float64 MLP (5 -> 8 -> 3) with weights fixed by ``seed``."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def _data(n, seed):
    """``n`` random 5-feature rows and labels in {0, 1, 2}."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 5)), rng.integers(0, 3, size=n)


def _weights(module):
    """A numpy copy of every entry of ``module``'s state dict."""
    return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}


def numpy_metrics(weights, x, y):
    """(logits, {loss, acc_top1, acc_top2}) of ``_net`` with ``weights`` on (x, y), in numpy."""
    net = _net(0)
    net.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    with torch.no_grad():
        logits = net(torch.from_numpy(x)).numpy()
    shifted = logits - logits.max(1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    best = np.argsort(-logits, axis=1)
    return logits, {"loss": -logp[np.arange(len(y)), y].mean(),
                    "acc_top1": (best[:, 0] == y).mean(),
                    "acc_top2": (best[:, :2] == y[:, None]).any(1).mean()}
