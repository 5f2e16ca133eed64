"""Process sets passed to ``init``: every rank's, registered on every rank.

Ranks may pass different sets at init: a set made from a split MPI communicator names only the
caller's own group (Horovod's documented pattern). Horovod's core builds its table from the
communicators of all ranks; here every rank's rank lists are gathered (one allgather of small
integers) and the union is registered on every rank in one order, rank 0's sets first, so each
set gets the same id everywhere. Frontends then give their own set objects those ids.
"""
from __future__ import annotations

from typing import Sequence

import torch

from accord.engine import session


def every_ranks_sets(mine: Sequence[Sequence[int]]) -> list[list[int]]:
    """Every rank's rank lists, rank 0's first (each rank sends ``[count, len, ranks..., ...]``).
    Collective over the global set: every rank calls it, also with an empty ``mine``."""
    own = [sorted(int(r) for r in ranks) for ranks in mine]
    if session.topology().size == 1:
        return own
    flat = [len(own)] + [x for ranks in own for x in (len(ranks), *ranks)]
    gathered = session.synchronize(session.submit("allgather", torch.tensor(flat, dtype=torch.int64),
                                                  "accord.init.process_sets")).tolist()
    found, at = [], 0
    while at < len(gathered):
        count, at = gathered[at], at + 1
        for _ in range(count):
            n = gathered[at]
            found.append(gathered[at + 1:at + 1 + n])
            at += 1 + n
    return found


def register_every_ranks_sets(mine: Sequence[Sequence[int]]) -> None:
    """Register (collectively) each set any rank passed that is not registered yet.

    Raises:
        ValueError: a set's ranks are invalid (empty, repeated, or outside the job).
    """
    for ranks in every_ranks_sets(mine):
        if session.find_process_set(ranks) is None:
            session.add_process_set(ranks)
