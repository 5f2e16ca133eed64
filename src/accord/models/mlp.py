"""Multi-layer perceptrons: a builder, and the ~26.2M-parameter MLP of the benchmarks.

``mlp_26m()`` is 1024 -> 4096 -> 4096 -> 1024 -> 1000 with ReLU: 26,200,040 parameters (105 MB of
float32 gradients per step), the communication-bound workload of benchmarks/RESULTS.md.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

__all__ = ["MLP", "mlp_26m"]


class MLP(nn.Module):
    """Flatten, then Linear + ReLU (+ dropout) per hidden size, then a Linear classifier.

    Args:
        in_features: size of a flattened input sample.
        hidden_sizes: widths of the hidden layers, in order (may be empty: a linear model).
        num_classes: outputs of the last layer.
        dropout: dropout probability after each hidden activation (0 = none).
    """

    def __init__(self, in_features: int, hidden_sizes: Sequence[int], num_classes: int,
                 dropout: float = 0.0) -> None:
        super().__init__()
        sizes = [in_features, *hidden_sizes, num_classes]
        if any(not isinstance(s, int) or s < 1 for s in sizes) or not 0.0 <= dropout < 1.0:
            raise ValueError(
                f"bad MLP shape: in_features={in_features}, hidden_sizes={list(hidden_sizes)}, "
                f"num_classes={num_classes}, dropout={dropout}.\n"
                "HINT: sizes are positive ints; dropout is in [0, 1)."
            )
        layers: list[nn.Module] = [nn.Flatten()]
        for width_in, width_out in zip(sizes[:-2], sizes[1:-1], strict=True):
            layers += [nn.Linear(width_in, width_out), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
        layers.append(nn.Linear(sizes[-2], sizes[-1]))
        self.in_features = in_features
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def mlp_26m(num_classes: int = 1000, in_features: int = 1024) -> MLP:
    """The benchmark MLP: in_features -> 4096 -> 4096 -> 1024 -> classes (26,200,040 params by default)."""
    return MLP(in_features, [4096, 4096, 1024], num_classes)
