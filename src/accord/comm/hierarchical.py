"""Hierarchical allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE): within each host, then across hosts.

With ``L`` ranks on each of ``H`` hosts, a flat allreduce sends every byte over the network from
every rank. The hierarchical one splits the tensor into ``L`` parts inside each host (a
reduce-scatter over the host's fast local communicator, shared memory by default), lets local
rank ``i`` of every host allreduce part ``i`` with its ``H - 1`` peers (the cross communicator,
one per local rank), and puts the parts back together inside each host (each local rank
broadcasts its part). Each
rank then sends ``1/L`` of the data across hosts, and the ``L`` cross allreduces run side by
side.

Only allreduce changes; every other collective runs on the flat communicator. The layout must
be homogeneous (the same number of ranks on every host) so that local rank ``i`` holds the same
part everywhere; :func:`hierarchy_problem` says why a job cannot use it.

Chosen automatically (HOROVOD_HIERARCHICAL_ALLREDUCE unset) when :func:`auto_hierarchy` finds no
reason against it, for allreduces of at least ``min_bytes``: each host then sends 1.0x the
buffer across the network instead of ``2 (n - 1) / n`` x (1.5x for 2 hosts x 2 ranks), which
measured 1.4x faster at 64 MB on 1 Gbit/s links (benchmarks/cluster_hierarchical.py); smaller
allreduces are latency-bound, and the two extra steps inside the host cost more than they save.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from accord import config
from accord.comm.backend import Communicator
from accord.comm.base_communicator import split_rows
from accord.comm.ops import ReduceOp

# Ops whose result does not depend on how the ranks are grouped. Integer AVERAGE (the only
# AVERAGE that reaches a communicator: the engine turns floating AVERAGE into SUM) does, through
# rounding, and runs flat.
_GROUPABLE = frozenset({ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT})


def hierarchy_problem(local_sets: Sequence[Sequence[int]]) -> str | None:
    """Why ranks laid out as ``local_sets`` (ranks per host) cannot reduce hierarchically, or
    None when they can: more than one host, more than one rank per host, the same count on each."""
    counts = sorted({len(s) for s in local_sets})
    if len(local_sets) < 2:
        return "every rank runs on one host (a flat allreduce is already local)"
    if len(counts) > 1:
        return f"hosts run different numbers of ranks ({', '.join(map(str, counts))}): the layout is not homogeneous"
    if counts[0] < 2:
        return "every host runs one rank (nothing to reduce within a host)"
    return None


def auto_hierarchy(local_sets: Sequence[Sequence[int]], flat_backend: str) -> str | None:
    """Why the automatic choice keeps allreduce flat, or None when it goes hierarchical: the
    layout allows it (:func:`hierarchy_problem`) and the flat communicator is Gloo picked by
    default (an explicitly chosen CPU backend, e.g. mpi, is left as the user asked)."""
    if flat_backend != "gloo" or str(config.get("ACCORD_CPU_BACKEND")).lower() != "auto":
        return f"the CPU backend was chosen explicitly ({flat_backend})"
    return hierarchy_problem(local_sets)


class HierarchicalCommunicator:
    """The flat communicator's collectives, with allreduce done host-first (see the module)."""

    # Batches must come to allreduce() as one buffer: the flat communicator's piecewise path,
    # if it has one, would bypass the hierarchy.
    supports_allreduce_many = None

    def __init__(self, flat: Communicator, local: Communicator, cross: Communicator,
                 min_bytes: int = 0) -> None:
        self.flat, self.local, self.cross = flat, local, cross
        self.min_bytes = min_bytes  # smaller allreduces run flat (every rank sees the same size)
        self.backend_name = f"hierarchical({local.backend_name}+{cross.backend_name})"
        self.ranks, self.rank, self.size = flat.ranks, flat.rank, flat.size
        self.hierarchical_allreduces = 0  # allreduces that took the three-step path (tests read it)

    def allreduce(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        """Reduce ``tensor`` in place: reduce-scatter in the host, allreduce across hosts,
        allgather in the host. Tensors smaller than a part per local rank or than ``min_bytes``,
        non-contiguous ones and integer AVERAGE go flat."""
        if (op not in _GROUPABLE or not tensor.is_contiguous() or tensor.numel() < self.local.size
                or tensor.numel() * tensor.element_size() < self.min_bytes):
            self.flat.allreduce(tensor, op)
            return
        whole = tensor.view(-1)
        part = self.local.reduce_scatter(whole, op)  # lower local ranks get the extra elements
        self.cross.allreduce(part, op)
        # Put the parts back together in place: each local rank broadcasts its part into the
        # others' tensors (an allgather would need a fresh result, a size agreement and a copy).
        rows = split_rows(whole.numel(), self.local.size)
        start = sum(rows[:self.local.rank])
        whole[start:start + part.numel()].copy_(part)
        start = 0
        for owner, count in enumerate(rows):
            if count:
                self.local.broadcast(whole[start:start + count], owner)
            start += count
        self.hierarchical_allreduces += 1

    def __getattr__(self, name: str) -> Any:
        # Every other collective (and capability probes such as supports_allreduce_many, which
        # the flat communicator may lack) is the flat communicator's.
        return getattr(self.__dict__["flat"], name)
