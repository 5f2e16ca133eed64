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
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

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


class HierarchicalCommunicator(Communicator):
    """The flat communicator's collectives, with allreduce done host-first (see the module)."""

    # Batches must come to allreduce() as one buffer: the flat communicator's piecewise path,
    # if it has one, would bypass the hierarchy.
    supports_allreduce_many = None

    def __init__(self, flat: Communicator, local: Communicator, cross: Communicator) -> None:
        self.flat, self.local, self.cross = flat, local, cross
        self.backend_name = f"hierarchical({local.backend_name}+{cross.backend_name})"
        self.ranks, self.rank, self.size = flat.ranks, flat.rank, flat.size
        self.hierarchical_allreduces = 0  # allreduces that took the three-step path (tests read it)

    def allreduce(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        """Reduce ``tensor`` in place: reduce-scatter in the host, allreduce across hosts,
        allgather in the host. Tensors smaller than a part per local rank, non-contiguous ones
        and integer AVERAGE go flat."""
        if op not in _GROUPABLE or not tensor.is_contiguous() or tensor.numel() < self.local.size:
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

    # Every other collective is the flat communicator's.
    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        self.flat.broadcast(tensor, root)

    def allgather(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.flat.allgather(tensor)

    def gather(self, tensor: torch.Tensor, root: int) -> torch.Tensor | None:
        return self.flat.gather(tensor, root)

    def scatter(self, chunks: Sequence[torch.Tensor] | None, root: int) -> torch.Tensor:
        return self.flat.scatter(chunks, root)

    def reduce(self, tensor: torch.Tensor, op: ReduceOp, root: int) -> None:
        self.flat.reduce(tensor, op, root)

    def reduce_scatter(self, tensor: torch.Tensor, op: ReduceOp) -> torch.Tensor:
        return self.flat.reduce_scatter(tensor, op)

    def alltoall(self, tensor: torch.Tensor, splits: Sequence[int] | None) -> Any:
        return self.flat.alltoall(tensor, splits)

    def barrier(self) -> None:
        self.flat.barrier()

    def __getattr__(self, name: str) -> Any:
        # Anything else (attributes such as meta_device, capability probes the flat
        # communicator may lack) is the flat communicator's.
        return getattr(self.__dict__["flat"], name)
