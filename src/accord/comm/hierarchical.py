"""Hierarchical allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE): within each host, then across hosts.

With ``L`` ranks on each of ``H`` hosts, a flat allreduce sends every byte over the network from
every rank. The hierarchical one splits the tensor into ``L`` parts inside each host (a
reduce-scatter over the host's fast local communicator, shared memory by default), lets local
rank ``i`` of every host allreduce part ``i`` with its ``H - 1`` peers (the cross communicator,
one per local rank), and puts the parts back together inside each host (each local rank
broadcasts its part). Each
rank then sends ``1/L`` of the data across hosts, and the ``L`` cross allreduces run side by
side.

Reduce-scatter and allgather (what a sharded optimizer runs instead of allreduce) go the same
way when the communicator knows every rank's place (``slots``): a reduce-scatter reduces inside
the host first, so that each local rank sends only its host's sum of the ``H`` shards its cross
peers own, and an allgather crosses hosts with each rank's own shard before it shares them
inside the host; each host then sends 1/2 of the buffer across per collective, the same bytes as
the hierarchical allreduce moves in its two halves. For that, the shards are laid out by (local
rank, cross rank) in a staging buffer, each padded to the largest shard (shards differ by at
most a row), so that each communicator's even split hands every rank the right ones. Every other
collective runs on the flat communicator. The layout must be homogeneous (the same number of
ranks on every host) so that local rank ``i`` holds the same part everywhere;
:func:`hierarchy_problem` says why a job cannot use it.

Chosen automatically (HOROVOD_HIERARCHICAL_ALLREDUCE unset) when :func:`auto_hierarchy` finds no
reason against it, for allreduces of at least ``min_bytes`` (1 MiB by default): each host then
sends 1.0x the buffer across the network instead of ``2 (n - 1) / n`` x (1.5x for 2 hosts x 2
ranks). Big allreduces are pipelined in pieces (:data:`PIECE_BYTES`), so that the steps inside
the host overlap the transfer between hosts. On simulated hosts with 1 Gbit/s links this measured
1.2-1.45x flat at 64 MB (benchmarks/cluster_hierarchical.py); smaller allreduces are
latency-bound. Where the links are as fast as the host's CPU (10 Gbit/s and more on the 2-core
test machine) the gain turns into a loss (0.5x), so the automatic choice times both paths on the
job's first big allreduces and keeps the faster (:mod:`accord.comm.path_choice`).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Sequence

import torch

from accord.comm.backend import Communicator
from accord.comm.base_communicator import split_rows
from accord.comm.ops import ReduceOp
from accord.comm.path_choice import FLAT, HIERARCHICAL, PathChooser
from accord.comm.settings import CommSettings

log = logging.getLogger("accord")

# Ops whose result does not depend on how the ranks are grouped. Integer AVERAGE (the only
# AVERAGE that reaches a communicator: the engine turns floating AVERAGE into SUM) does, through
# rounding, and runs flat.
_GROUPABLE = frozenset({ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT})
# Allreduces of at least two pieces of this size are pipelined (see _pipelined): big enough that
# each piece's collectives are bandwidth-bound, small enough that the first piece's local step,
# the part nothing hides, is short.
PIECE_BYTES = 2 * 1024 * 1024


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
    problem = hierarchy_problem(local_sets)
    if problem is None and (flat_backend != "gloo" or CommSettings.from_config().cpu_backend.lower() != "auto"):
        return f"the CPU backend was chosen explicitly ({flat_backend})"
    return problem


def shard_slots(local_sets: Sequence[Sequence[int]], cross_sets: Sequence[Sequence[int]]) -> list[int] | None:
    """Each rank's slot in a hierarchical reduce-scatter's staging buffer: ``i x hosts + c`` for
    the rank at place ``i`` of its host's list and ``c`` of its cross list, or None when the
    place in the host is not the index of the cross list (the layout the even splits need)."""
    hosts = len(local_sets)
    slots = [-1] * sum(len(s) for s in local_sets)
    for members in local_sets:
        for i, g in enumerate(members):
            if i >= len(cross_sets) or g not in cross_sets[i]:
                return None
            slots[g] = i * hosts + list(cross_sets[i]).index(g)
    return slots if sorted(slots) == list(range(len(slots))) else None


class HierarchicalCommunicator(Communicator):
    """The flat communicator's collectives, with allreduce done host-first (see the module)."""

    # Batches must come to allreduce() as one buffer: the flat communicator's piecewise path,
    # if it has one, would bypass the hierarchy.
    supports_allreduce_many = None
    allreduce_voted = None  # likewise: a planned cycle's voted collective must take the hierarchy

    def __init__(self, flat: Communicator, local: Communicator, cross: Communicator,
                 min_bytes: int = 0, measure: bool = False, slots: Sequence[int] | None = None) -> None:
        """``slots[g]``: where rank ``g``'s shard goes in a staging buffer, ``local rank x hosts
        + cross rank`` (:func:`shard_slots`); without it reduce-scatter and allgather run flat."""
        self.flat, self.local, self.cross = flat, local, cross
        self.min_bytes = min_bytes  # smaller collectives run flat (every rank sees the same size)
        # automatic choice: time both paths on the first big collectives of each kind, keep the faster
        kinds = ("allreduce", "reduce_scatter", "allgather") if measure else ()
        self.choosers = {kind: PathChooser() for kind in kinds}
        self.chooser = self.choosers.get("allreduce")
        self.slots = list(slots) if slots is not None else None
        self.piece_bytes = PIECE_BYTES
        self.backend_name = f"hierarchical({local.backend_name}+{cross.backend_name})"
        self.ranks, self.rank, self.size = flat.ranks, flat.rank, flat.size
        self.hierarchical_allreduces = 0  # allreduces that took the three-step path (tests read it)
        self.hierarchical_scatters = 0  # reduce-scatters and allgathers that did (tests read them)
        self.hierarchical_gathers = 0

    def close(self) -> None:
        """Close the flat, host and cross-host communicators (every member calls it)."""
        for comm in (self.flat, self.local, self.cross):
            close = getattr(comm, "close", None)
            if close is not None:
                close()

    def allreduce(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        """Reduce ``tensor`` in place: reduce-scatter in the host, allreduce across hosts,
        allgather in the host. Tensors smaller than a part per local rank or than ``min_bytes``,
        non-contiguous ones and integer AVERAGE go flat; with ``measure``, the first big ones
        time both paths and the faster is kept (:mod:`accord.comm.path_choice`)."""
        if (op not in _GROUPABLE or not tensor.is_contiguous() or tensor.numel() < self.local.size
                or tensor.numel() * tensor.element_size() < self.min_bytes):
            self.flat.allreduce(tensor, op)
            return
        if self.chooser is not None and self.chooser.choice != HIERARCHICAL:
            self._measured(tensor, op)
            return
        self._hierarchical(tensor, op)

    def _measured(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        """Run the path the chooser asks for, timed; agree on the faster one when it is due."""
        assert self.chooser is not None
        self._timed(self.chooser, "allreduce", tensor.numel() * tensor.element_size(),
                    lambda: self._hierarchical(tensor, op), lambda: self.flat.allreduce(tensor, op))

    def _timed(self, chooser: PathChooser, kind: str, nbytes: int, hierarchical: Callable[[], Any],
               flat: Callable[[], Any]) -> Any:
        """Run (and time) the path ``chooser`` asks for; agree on the faster one when it is due.
        ``nbytes`` must be the same on every rank, so that every rank times the same paths."""
        path = chooser.next_path(nbytes)
        start = time.perf_counter()
        result = hierarchical() if path == HIERARCHICAL else flat()
        if chooser.choice is None and chooser.record(nbytes, path, time.perf_counter() - start):
            rates = torch.tensor(chooser.rates(), dtype=torch.float64)
            self.flat.allreduce(rates, ReduceOp.SUM)  # the same sums, so the same choice, everywhere
            choice = chooser.decide(rates.tolist())
            if self.rank == 0:
                log.info("automatic hierarchical %s: %s (median over %d timed pairs, summed over "
                         "ranks: hierarchical %.2f ms/MiB, flat %.2f ms/MiB)", kind, choice, chooser.pairs,
                         rates[0].item() * 1e3, rates[1].item() * 1e3)
        return result

    def _path(self, kind: str, nbytes: int, hierarchical: Callable[[], Any], flat: Callable[[], Any]) -> Any:
        """A reduce-scatter or allgather of ``nbytes`` in all (the same on every rank), that
        every rank can run host-first: as forced, or as the automatic choice for ``kind`` says."""
        chooser = self.choosers.get(kind)
        if chooser is None:
            return hierarchical()
        if chooser.choice is not None:
            return hierarchical() if chooser.choice == HIERARCHICAL else flat()
        return self._timed(chooser, kind, nbytes, hierarchical, flat)

    def _may_take_hierarchy(self, kind: str, nbytes: int) -> bool:
        """What every rank decides alike from agreed sizes: big enough, and not chosen flat."""
        chooser = self.choosers.get(kind)
        return nbytes >= self.min_bytes and not (chooser is not None and chooser.choice == FLAT)

    def _agree(self, row: list[int]) -> torch.Tensor:
        """Every rank's ``row`` of small integers (one small flat allgather), in rank order."""
        return self.flat.allgather(torch.tensor([row], dtype=torch.int64))

    def _hierarchical(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        """The three steps, pipelined in pieces when the tensor is big."""
        whole = tensor.view(-1)
        count = max(1, min(whole.numel() * whole.element_size() // self.piece_bytes,
                           whole.numel() // self.local.size))
        if count == 1:
            part = self.local.reduce_scatter(whole, op)  # lower local ranks get the extra elements
            self.cross.allreduce(part, op)
            self._assemble(whole, part)
        else:
            self._pipelined(list(torch.tensor_split(whole, count)), op)
        self.hierarchical_allreduces += 1

    def _assemble(self, piece: torch.Tensor, part: torch.Tensor) -> None:
        """Put the reduced parts back together in place: each local rank broadcasts its part into
        the others' tensors (an allgather would need a fresh result, a size agreement and a copy)."""
        rows = split_rows(piece.numel(), self.local.size)
        start = sum(rows[:self.local.rank])
        piece[start:start + part.numel()].copy_(part)
        start = 0
        for owner, count in enumerate(rows):
            if count:
                self.local.broadcast(piece[start:start + count], owner)
            start += count

    def _pipelined(self, pieces: list[torch.Tensor], op: ReduceOp) -> None:
        """The three steps piece by piece, the network's step on a helper thread: while piece
        ``k`` crosses hosts, this thread reduce-scatters the next pieces (and assembles the
        earlier ones) in the host, so the host's CPU work hides behind the transfer. Each
        communicator still sees its collectives in the same order on every rank."""
        parts: queue.Queue[torch.Tensor | None] = queue.Queue()
        crossed = [threading.Event() for _ in pieces]
        errors: list[BaseException] = []

        def cross() -> None:
            for k in range(len(pieces)):
                part = parts.get()
                if part is None:  # the local steps failed: nothing more will come
                    return
                try:
                    self.cross.allreduce(part, op)
                except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
                    errors.append(exc)
                    for event in crossed:
                        event.set()
                    return
                crossed[k].set()

        helper = threading.Thread(target=cross, name="accord-hierarchical-cross", daemon=True)
        helper.start()
        try:
            reduced = []
            for piece in pieces:
                reduced.append(self.local.reduce_scatter(piece, op))
                parts.put(reduced[-1])
            for piece, part, event in zip(pieces, reduced, crossed):
                event.wait()
                if errors:
                    raise errors[0]
                self._assemble(piece, part)
        finally:
            parts.put(None)
            helper.join()

    # --- reduce-scatter and allgather through the hierarchy ----------------------------------

    def reduce_scatter(self, tensor: torch.Tensor, op: ReduceOp, out: torch.Tensor | None = None) -> torch.Tensor:
        """Reduce ``tensor`` over every rank; this rank gets its rows of dim 0 (lower ranks get
        the extra ones), in ``out`` when given. Host-first when the layout is known (``slots``),
        the op groupable, the tensor big enough and every rank's arguments usable (agreed in one
        small flat allgather, so that no rank takes another path than its peers); else flat.
        Raises as the flat one does."""
        def flat() -> torch.Tensor:
            return self.flat.reduce_scatter(tensor, op) if out is None else self.flat.reduce_scatter(tensor, op, out)

        nbytes = tensor.numel() * tensor.element_size()
        if (self.slots is None or op not in _GROUPABLE or tensor.dim() == 0 or tensor.shape[0] < self.size
                or not self._may_take_hierarchy("reduce_scatter", nbytes)):
            return flat()
        rows = split_rows(tensor.shape[0], self.size)
        usable = tensor.is_contiguous() and (out is None or (
            tuple(out.shape) == (rows[self.rank], *tensor.shape[1:]) and out.dtype == tensor.dtype
            and out.device == tensor.device))
        if not bool(self._agree([int(usable)]).all()):
            return flat()  # (which says what is wrong, on every rank)
        return self._path("reduce_scatter", nbytes, lambda: self._scatter_hierarchical(tensor, op, out, rows), flat)

    def _scatter_hierarchical(self, tensor: torch.Tensor, op: ReduceOp, out: torch.Tensor | None,
                              rows: list[int]) -> torch.Tensor:
        assert self.slots is not None
        width = max(rows)
        staged = tensor.new_zeros((self.size * width, *tensor.shape[1:]))
        start = 0
        for g, count in enumerate(rows):
            staged[self.slots[g] * width:self.slots[g] * width + count].copy_(tensor[start:start + count])
            start += count
        host_sums = self.local.reduce_scatter(staged, op)  # this local rank's cross peers' shards
        del staged
        mine = self.cross.reduce_scatter(host_sums, op)[:rows[self.rank]]
        self.hierarchical_scatters += 1
        if out is None:
            return mine
        out.copy_(mine)
        return out

    def allgather(self, tensor: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Concatenate every rank's ``tensor`` along dim 0 (first dims may differ), into ``out``
        when given. Host-last when the layout is known (``slots``): the row counts (and whether
        every rank's arguments are usable) are agreed first in one small flat allgather, then
        each rank's rows cross hosts once. Raises as the flat one does."""
        def flat() -> torch.Tensor:
            return self.flat.allgather(tensor) if out is None else self.flat.allgather(tensor, out)

        if self.slots is None or tensor.dim() == 0:
            return flat()
        usable = tensor.is_contiguous() and (out is None or (
            out.is_contiguous() and out.dtype == tensor.dtype and out.device == tensor.device
            and tuple(out.shape[1:]) == tuple(tensor.shape[1:])))
        # (rows, usable, out rows, elements per row): the same sizes everywhere or flat, which
        # then names what differs
        table = self._agree([tensor.shape[0], int(usable), -1 if out is None else out.shape[0],
                             tensor[0].numel() if tensor.shape[0] else -1])
        counts = [int(c) for c in table[:, 0]]
        per_row = {int(v) for v in table[:, 3] if int(v) >= 0}
        outs = {int(v) for v in table[:, 2] if int(v) >= 0}
        nbytes = sum(counts) * (per_row.pop() if len(per_row) == 1 else 0) * tensor.element_size()
        if (not bool(table[:, 1].all()) or len(per_row) > 1 or nbytes == 0 or outs - {sum(counts)}
                or not self._may_take_hierarchy("allgather", nbytes)):
            return flat()
        return self._path("allgather", nbytes, lambda: self._gather_hierarchical(tensor, counts, out), flat)

    def _gather_hierarchical(self, tensor: torch.Tensor, counts: list[int], out: torch.Tensor | None) -> torch.Tensor:
        assert self.slots is not None
        width = max(counts)
        padded = tensor.new_zeros((width, *tensor.shape[1:]))
        padded[:tensor.shape[0]].copy_(tensor)  # (before out is written: tensor may be a view of it)
        staged = self.local.allgather(self.cross.allgather(padded))  # every shard, at its slot
        result = out if out is not None else tensor.new_empty((sum(counts), *tensor.shape[1:]))
        start = 0
        for g, count in enumerate(counts):
            result[start:start + count].copy_(staged[self.slots[g] * width:self.slots[g] * width + count])
            start += count
        self.hierarchical_gathers += 1
        return result

    # Every other collective is the flat communicator's.
    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        self.flat.broadcast(tensor, root)

    def gather(self, tensor: torch.Tensor, root: int) -> torch.Tensor | None:
        return self.flat.gather(tensor, root)

    def scatter(self, chunks: Sequence[torch.Tensor] | None, root: int) -> torch.Tensor:
        return self.flat.scatter(chunks, root)

    def reduce(self, tensor: torch.Tensor, op: ReduceOp, root: int) -> None:
        self.flat.reduce(tensor, op, root)

    def alltoall(self, tensor: torch.Tensor, splits: Sequence[int] | None) -> Any:
        return self.flat.alltoall(tensor, splits)

    def barrier(self) -> None:
        self.flat.barrier()

    def __getattr__(self, name: str) -> Any:
        # Anything else (attributes such as meta_device, capability probes the flat
        # communicator may lack) is the flat communicator's.
        return getattr(self.__dict__["flat"], name)
