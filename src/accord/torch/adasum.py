"""Adasum on any backend (Horovod needs MPI for it on CPU; we gather instead).

Adasum combines two gradients ``a`` and ``b`` as::

    (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

which sums orthogonal gradients and averages parallel ones. Horovod applies it over a binary
tree of ranks (pairs (0,1), (2,3)... then pairs of pairs), each tensor on its own, so the
size must be a power of two. Here every rank allgathers the (pre-scaled) flattened tensors and
evaluates the same tree locally in float64: identical results on every rank, at the cost of an
allgather (``size`` times the bytes of an allreduce), which is fine for the CPU jobs it serves.
"""
from __future__ import annotations

import math
import sys
from typing import Any, Sequence

import torch

from accord.engine import Compressor, NoneCompressor
from accord.errors import with_hint
from accord.torch import gateway

# Below this squared norm a gradient counts as zero: its coefficient stays 1. Horovod 0.28's
# guard is sqrt(DBL_MIN) (~1.5e-154), so small but real gradients (|g|^2 of 1e-10, say) are
# still combined, not summed.
_TINY_NORMSQ = math.sqrt(sys.float_info.min)


def combine_pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Adasum of two flat float64 vectors."""
    dot = float(torch.dot(a, b))
    a_sq = float(torch.dot(a, a))
    b_sq = float(torch.dot(b, b))
    a_coeff = 1.0 - dot / a_sq * 0.5 if a_sq >= _TINY_NORMSQ else 1.0
    b_coeff = 1.0 - dot / b_sq * 0.5 if b_sq >= _TINY_NORMSQ else 1.0
    return a_coeff * a + b_coeff * b


def combine_tree(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """Adasum of ``rows`` (a power-of-two count) over Horovod's binary tree of neighbours."""
    level = list(rows)
    if len(level) & (len(level) - 1):
        raise ValueError(f"Adasum needs a power-of-two number of inputs, got {len(level)}")
    while len(level) > 1:
        level = [combine_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def reduce_gathered(gathered: torch.Tensor, like: torch.Tensor, postscale: float) -> torch.Tensor:
    """Turn the allgathered ``[size, numel]`` rows into the Adasum result shaped like ``like``."""
    rows = [row.to(torch.float64) for row in gathered]
    out = combine_tree(rows)
    if postscale != 1.0:
        out = out * postscale
    return out.to(like.dtype).reshape(like.shape)


def start(tensors: Sequence[torch.Tensor], inplace: bool, name: str | None, prescale: float,
          postscale: float, set_id: int, grouped: bool,
          compression: type[Compressor] | Compressor = NoneCompressor,
          problems: Sequence[str] = ()) -> int:
    """Start Adasum of ``tensors`` (one allgather per tensor); return the facade's handle.
    ``compression`` applies to what is gathered; the tree is evaluated in float64.
    ``problems``: per tensor, what the caller refuses in it (see :func:`gateway.start`); a tensor
    that is not floating is refused the same way, on every rank at ``synchronize()``."""
    flats, problems = [], list(problems) or [""] * len(tensors)
    for i, t in enumerate(tensors):
        if not problems[i] and not (t.is_floating_point() or t.is_complex()):
            problems[i] = with_hint(f"Adasum needs floating point tensors, got {t.dtype}",
                                    "use Sum or Average for other dtypes, or pass a floating tensor")
        if problems[i]:
            flats.append(gateway.wire(t))  # never runs: the request is refused on every rank
            continue
        flat = t.detach().reshape(1, -1)
        if prescale != 1.0:
            flat = flat * prescale
        flats.append(flat.contiguous())

    def finish(results: list[Any]) -> Any:
        outs = []
        for t, gathered in zip(tensors, results):
            value = reduce_gathered(gathered, t, postscale)
            if inplace:
                t.detach().copy_(value)
                value = t
            outs.append(value)
        return outs if grouped else outs[0]

    return gateway.start("allgather", flats, name, set_id, finish, grouped=grouped,
                         keep=tuple(tensors), prefix="allreduce", compression=compression,
                         problems=problems)
