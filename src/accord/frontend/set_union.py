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

from accord import engine


def every_ranks_sets(mine: Sequence[Sequence[int]]) -> list[list[int]]:
    """Every rank's rank lists, rank 0's first (each rank sends ``[count, len, ranks..., ...]``).
    Collective over the global set: every rank calls it, also with an empty ``mine``."""
    own = [sorted(int(r) for r in ranks) for ranks in mine]
    if engine.topology().size == 1:
        return own
    flat = [len(own)] + [x for ranks in own for x in (len(ranks), *ranks)]
    gathered = engine.synchronize(engine.submit("allgather", torch.tensor(flat, dtype=torch.int64),
                                                 "accord.init.process_sets")).tolist()
    found, at = [], 0
    while at < len(gathered):
        count, at = gathered[at], at + 1
        for _ in range(count):
            n = gathered[at]
            found.append(gathered[at + 1:at + 1 + n])
            at += 1 + n
    return found


def register_init_sets(mine: Sequence[Sequence[int]], first: bool) -> list[int | None]:
    """Register every rank's sets (collectively) and return the ids of ``mine``, None for an
    entry that duplicates an earlier one or the global set (Horovod refuses those).

    ``first``: the ``init`` that started accord, made by every rank, so the gathering runs on
    every rank even where ``mine`` is empty. On a later ``init(process_sets=...)`` it runs only
    when this rank passes sets, and every rank must then pass some.

    Raises:
        ValueError: a set's ranks are invalid (empty, repeated, or outside the job).
    """
    if first or mine:
        for ranks in every_ranks_sets(mine):
            if engine.find_process_set(ranks) is None:
                engine.add_process_set(ranks)
    ids: list[int | None] = []
    seen = {engine.GLOBAL_ID}
    for ranks in mine:
        set_id = engine.find_process_set(sorted(int(r) for r in ranks))
        ids.append(None if set_id is None or set_id in seen else set_id)
        if set_id is not None:
            seen.add(set_id)
    return ids


def duplicate_error(index: int, process_set: object) -> ValueError:
    """Horovod's error for a duplicate entry of ``init(process_sets=...)``."""
    return ValueError(f"Horovod could not be initialized because process_sets entry number {index} "
                      f"is a duplicate: {process_set}")
