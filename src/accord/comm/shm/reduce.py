"""The reduction steps of the shm backend: which tensor pieces each chunk holds, and the stages
that copy them into a rank's slot and reduce the slots into the outputs.

Used by :class:`~accord.comm.shm.communicator.ShmCommunicator`, whose pipeline runs chunk ``c``'s
stage ``k`` in phase ``start + c + k`` (see that module). Reductions combine the slots in rank
order (``slot_0 op slot_1 op ...``), so every rank computes the same bits.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from accord.comm.base_communicator import split_rows
from accord.comm.ops import ReduceOp

Piece = tuple[int, int, int, int]  # (tensor index, first element, end element, offset in the chunk)
Stage = Callable[[int, int], None]  # (chunk, bank)

# Ops whose result does not depend on the operands' order, bit for bit (IEEE addition and
# multiplication commute exactly; minimum/maximum do not: the sign of a zero depends on it).
_FOREACH_IN_PLACE = {ReduceOp.SUM: torch._foreach_add_, ReduceOp.PRODUCT: torch._foreach_mul_}
_FNS = {ReduceOp.SUM: torch.add, ReduceOp.MIN: torch.minimum, ReduceOp.MAX: torch.maximum,
        ReduceOp.PRODUCT: torch.mul, ReduceOp.BAND: torch.bitwise_and, ReduceOp.BOR: torch.bitwise_or,
        ReduceOp.BXOR: torch.bitwise_xor}


def chunk_pieces(sizes: Sequence[int], per: int) -> tuple[list[list[Piece]], int]:
    """Split the concatenation of tensors of ``sizes`` elements into chunks of ``per`` elements;
    for each chunk, the tensor pieces it holds. Returns (pieces per chunk, total elements)."""
    total = sum(sizes)
    chunks: list[list[Piece]] = [[] for _ in range(max(1, -(-total // per)))]
    start = 0
    for i, n in enumerate(sizes):
        pos = 0
        while pos < n:  # empty tensors hold no piece
            c, at = divmod(start + pos, per)
            take = min(n - pos, per - at)
            chunks[c].append((i, pos, pos + take, at))
            pos += take
        start += n
    return chunks, total


def combine(out: torch.Tensor, bank: Sequence[torch.Tensor], lo: int, hi: int, op: ReduceOp,
            size: int) -> None:
    """``out = slot_0[lo:hi] op slot_1[lo:hi] op ...`` over ``size`` slots, in rank order."""
    if size == 1:
        out.copy_(bank[0][lo:hi])
        return
    fn = _FNS[op]
    fn(bank[0][lo:hi], bank[1][lo:hi], out=out)
    for j in range(2, size):
        fn(out, bank[j][lo:hi], out=out)


def small_stages(src: torch.Tensor, out: torch.Tensor, views: Sequence[Sequence[torch.Tensor]], me: int,
                 size: int, op: ReduceOp, receives: bool) -> list[Stage]:
    """The two stages of a reduction of one flat tensor that fits in one chunk: ``views[bank][i]``
    is rank i's slot cut to the tensor's size (in its dtype). The same combination in rank
    order as :func:`reduction_stages`, with no slicing per call."""

    def copy_in(c: int, b: int) -> None:
        views[b][me].copy_(src)

    def reduce_out(c: int, b: int) -> None:
        if not receives:
            return
        bank = views[b]
        if size == 1:
            out.copy_(bank[0])
            return
        fn = _FNS[op]
        fn(bank[0], bank[1], out=out)
        for j in range(2, size):
            fn(out, bank[j], out=out)

    return [copy_in, reduce_out]


def reduction_stages(ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
                     pieces: Sequence[Sequence[Piece]], areas: Sequence[Sequence[torch.Tensor]],
                     me: int, size: int, per: int, op: ReduceOp, receives: bool,
                     direct: bool, scratch: torch.Tensor, in_place: bool = False,
                     postscale: float = 1.0) -> list[Stage]:
    """The pipeline stages of an allreduce/reduce of the flat ``ins`` into the flat ``outs``.

    ``areas[bank][i]``: rank i's slot (i < size) or the result area (i == size), typed in the
    wire dtype, which ``ins`` and ``outs`` may differ from: copying in and out casts, so a
    compressed allreduce needs no separate cast pass over the tensors. ``scratch``: a private
    chunk-sized area in the wire dtype. ``direct``: every receiving rank reduces whole chunks
    itself (copy in, reduce out); otherwise rank i reduces part i of each chunk into the result
    area and every rank copies it out. ``in_place``: each output is its input (the same tensor),
    of the wire dtype. ``postscale``: the outputs are multiplied by it, chunk by chunk once each
    is written (while it is in cache), in the outputs' dtype: the bits of scaling them after the op.
    """
    sizes = [t.numel() for t in ins]
    numel = sum(sizes)
    wire = scratch.dtype

    def part(tensors: Sequence[torch.Tensor], i: int, lo: int, hi: int) -> torch.Tensor:
        return tensors[i] if lo == 0 and hi == sizes[i] else tensors[i][lo:hi]  # whole: no view

    def used(ps: Sequence[Piece]) -> int:  # a chunk's pieces lie back to back from offset 0
        return ps[-1][3] + ps[-1][2] - ps[-1][1]

    def copy_in(c: int, b: int) -> None:
        ps = pieces[c]
        if not ps:  # an empty op still runs its one phase (the descriptor check)
            return
        slot = areas[b][me]
        if len(ps) == 1:
            i, lo, hi, at = ps[0]
            slot[at:at + hi - lo].copy_(part(ins, i, lo, hi))
        else:
            # One call per chunk, not one op per piece: per-op dispatch, not bandwidth,
            # dominates 100 KB pieces. cat casts into the slot's dtype.
            torch.cat([part(ins, i, lo, hi) for i, lo, hi, _ in ps], out=slot[:used(ps)])

    def reduce_out(c: int, b: int) -> None:
        ps = pieces[c]
        if not receives or not ps:
            return
        if len(ps) == 1 and outs[ps[0][0]].dtype == wire:
            i, lo, hi, at = ps[0]
            combine(part(outs, i, lo, hi), areas[b], at, at + hi - lo, op, size)
            return
        # Several pieces (or a cast): reduce the chunk's used span once into the cache-resident
        # scratch, then copy the pieces out, casting to the outputs' dtype. Each output is
        # written once; reducing piecewise into the outputs writes them once per rank.
        n = used(ps)
        combine(scratch[:n], areas[b], 0, n, op, size)
        if len(ps) == 1:
            i, lo, hi, at = ps[0]
            part(outs, i, lo, hi).copy_(scratch[at:at + hi - lo])
        else:
            views = scratch[:n].split([hi - lo for _, lo, hi, _ in ps])
            torch._foreach_copy_([part(outs, i, lo, hi) for i, lo, hi, _ in ps], list(views))

    def reduce_part(c: int, b: int) -> None:
        lo = c * per
        parts = split_rows(min(numel, lo + per) - lo, size)
        a = sum(parts[:me])
        if parts[me]:
            combine(areas[b][size][a:a + parts[me]], areas[b], a, a + parts[me], op, size)

    def copy_out(c: int, b: int) -> None:
        if receives:
            result = areas[b][size]
            for i, lo, hi, at in pieces[c]:
                outs[i][lo:hi].copy_(result[at:at + hi - lo])  # casts to the output's dtype

    def add_peer(c: int, b: int) -> None:
        # Two ranks, outputs that still hold this rank's inputs: ``out = out op peer`` is
        # ``slot_0 op slot_1`` bit for bit (the op commutes), one call per chunk, and each output
        # is read and written once, with no scratch pass.
        ps = pieces[c]
        if not ps:
            return
        peer = areas[b][1 - me]
        if len(ps) == 1:
            i, lo, hi, at = ps[0]
            mine = [part(outs, i, lo, hi)]
            foreach(mine, [peer[at:at + hi - lo]])
        else:
            mine = [part(outs, i, lo, hi) for i, lo, hi, _ in ps]
            foreach(mine, list(peer[:used(ps)].split([hi - lo for _, lo, hi, _ in ps])))
        if postscale != 1.0:
            torch._foreach_mul_(mine, postscale)

    def scaled(stage: Stage) -> Stage:
        def run(c: int, b: int) -> None:
            stage(c, b)
            if receives and pieces[c]:
                torch._foreach_mul_([part(outs, i, lo, hi) for i, lo, hi, _ in pieces[c]], postscale)
        return run

    foreach = _FOREACH_IN_PLACE.get(op)
    if direct and receives and size == 2 and in_place and foreach is not None:
        return [copy_in, add_peer]
    if direct:
        return [copy_in, reduce_out if postscale == 1.0 else scaled(reduce_out)]
    return [copy_in, reduce_part, copy_out if postscale == 1.0 else scaled(copy_out)]
